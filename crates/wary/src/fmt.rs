//! Logging that compiles to defmt on the device and to nothing elsewhere, so the core never
//! formats strings of its own. Only classes, numbers and keys are logged: never payload bytes,
//! credentials or raw error text.

#[cfg(feature = "defmt")]
macro_rules! debug {
    ($($arg:tt)*) => { ::defmt::debug!($($arg)*) };
}

#[cfg(not(feature = "defmt"))]
macro_rules! debug {
    ($($arg:tt)*) => {{}};
}

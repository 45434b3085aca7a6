//! Logging that compiles to defmt with the `defmt` feature and to nothing without it.
//!
//! Only step names, result-code names and counts go through here: the APN is configuration and
//! never reaches a log line.

#![allow(unused_macros)]

macro_rules! debug {
    ($($arg:tt)*) => {{
        #[cfg(feature = "defmt")]
        ::defmt::debug!($($arg)*);
        #[cfg(not(feature = "defmt"))]
        { let _ = format_args!($($arg)*); }
    }};
}

macro_rules! warn {
    ($($arg:tt)*) => {{
        #[cfg(feature = "defmt")]
        ::defmt::warn!($($arg)*);
        #[cfg(not(feature = "defmt"))]
        { let _ = format_args!($($arg)*); }
    }};
}

//! Old names, kept for one release so code written against them still compiles, with a
//! warning that names the new one. Each is a type alias or a function: `#[deprecated]` on a
//! `pub use` would not warn.

/// The old name of [`crate::Ambiguous`]: it governs more than duplicate headers.
#[deprecated(since = "0.1.0", note = "renamed `Ambiguous`: it also decides how malformed values are read")]
pub type Duplicates = crate::retry_after::Ambiguous;

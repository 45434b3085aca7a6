//! The version of the ledger's line formats, in a leaf module: the ledger writes it on every
//! line and the policy fingerprint starts with it, so both import it from here and neither
//! imports the other.

/// The version of the ledger's line formats (the device line and the JSON line). It is also the
/// first field of [`crate::Policy::fingerprint`], so a change of format changes every
/// fingerprint.
pub const LEDGER_VERSION: u32 = 2;

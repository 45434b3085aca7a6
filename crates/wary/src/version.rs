//! The versions of the ledger's line formats and of the policy's settings encoding, in a leaf
//! module: the ledger writes the one on every line and the policy fingerprint starts with the
//! other, so both import them from here and neither imports the other.

/// The version of the ledger's line formats (the device line and the JSON line). A reader
/// refuses a line of any other version, saying why ([`crate::ledger::LineError::Version`]).
///
/// - 1: times in ticks and seconds.
/// - 2: times in milliseconds; keys laid out device (32 bits) | boot (32) | sequence (64).
/// - 3: keys laid out device (64 bits) | boot (32) | sequence (32) (see
///   [`crate::Key::from_parts`]). No field was added or removed, but the key field's device part
///   is now the whole device id: a version 2 key read as a version 3 one would name a device
///   that does not exist.
/// - 4: each attempt says what the endpoint's pace and circuit breaker said about it
///   ([`crate::ledger::Admission`]: the pace's rate, bucket and wait, the breaker's phase and
///   time left), and a call they ended carries what they said about the refused retry. A
///   version 3 line cannot say whether a pace wait was charged to the call's budget, so its
///   decisions cannot be replayed as a version 4 reader replays them.
///
/// The policy's fingerprint does not hash this version but `POLICY_ENCODING`: a policy's
/// settings are encoded as they were in version 2, so the same policy keeps its fingerprint
/// across line versions.
pub const LEDGER_VERSION: u32 = 4;

/// The version of the settings' encoding in [`crate::Policy::fingerprint`]: 2, the ledger
/// format's version when the encoding was last changed. Fixed on its own since ledger version
/// 3, whose change (the key layout) left the settings alone.
pub const POLICY_ENCODING: u32 = 2;

//! What a dial or a hang-up ends with: the step that failed, why, and what the caller should do
//! about it ([`Class`]). How long to wait before trying again is the caller's retry policy;
//! this crate only says which kind of wait makes sense.

use core::fmt;

use embedded_io_async::ErrorKind;

/// The chat's steps, in the order a dial and a hang-up run them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Step {
    /// `AT`, until the modem answers `OK`.
    Probe,
    /// `ATE0`: echo off.
    EchoOff,
    /// `AT&D2`: DTR off hangs up (only with [`HangUp::Dtr`](crate::HangUp::Dtr)).
    DtrMode,
    /// `AT+CGDCONT=1,"IP","<apn>"`: define the packet data context.
    DefineContext,
    /// `ATD*99#`, until `CONNECT`.
    Dial,
    /// Guard time, `+++`, guard time: back to command mode.
    Escape,
    /// DTR dropped and raised again through the board's [`Dtr`](crate::Dtr) pin.
    Dtr,
    /// `ATH`: hang up.
    HangUp,
}

impl Step {
    /// The step's name, for logs and metrics.
    pub const fn name(self) -> &'static str {
        match self {
            Step::Probe => "probe",
            Step::EchoOff => "echo_off",
            Step::DtrMode => "dtr_mode",
            Step::DefineContext => "define_context",
            Step::Dial => "dial",
            Step::Escape => "escape",
            Step::Dtr => "dtr",
            Step::HangUp => "hang_up",
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The `<err>` of a `+CME ERROR: <err>` final result code (3GPP TS 27.007).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum CmeError {
    /// The numeric form (`AT+CMEE=1`), e.g. 30 for "no network service".
    Code(u16),
    /// The verbose form (`AT+CMEE=2`) or a number out of range; its text is not kept.
    Verbose,
}

impl fmt::Display for CmeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CmeError::Code(n) => write!(f, "{n}"),
            CmeError::Verbose => f.write_str("verbose"),
        }
    }
}

/// Why a step failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Failure {
    /// The modem answered `ERROR`.
    #[error("ERROR")]
    Error,
    /// The modem answered `+CME ERROR: <err>`.
    #[error("+CME ERROR: {0}")]
    Cme(CmeError),
    /// `NO CARRIER`: the data call could not be set up.
    #[error("NO CARRIER")]
    NoCarrier,
    /// `BUSY`.
    #[error("BUSY")]
    Busy,
    /// `NO DIALTONE`: no network to dial on.
    #[error("NO DIALTONE")]
    NoDialtone,
    /// `NO ANSWER`.
    #[error("NO ANSWER")]
    NoAnswer,
    /// `ATD*99#` answered `OK` instead of `CONNECT`: no data mode to hand to PPP.
    #[error("OK without CONNECT")]
    OkWithoutConnect,
    /// Not one byte arrived within the step's time limit.
    #[error("silence")]
    Silence,
    /// Bytes arrived, but no result code for the command within the step's time limit (only
    /// echo, noise, garbage or overlong lines).
    #[error("no result code")]
    Unanswered,
    /// The port's read failed.
    #[error("port read error: {0:?}")]
    Read(ErrorKind),
    /// The port's write or flush failed.
    #[error("port write error: {0:?}")]
    Write(ErrorKind),
    /// The port could not take the command (or flush it) within the step's time limit.
    #[error("port write stalled")]
    WriteStalled,
    /// The port's write accepted zero bytes, again and again.
    #[error("port accepts no bytes")]
    WriteZero,
    /// The port's read returned zero bytes (end of stream), again and again.
    #[error("port closed")]
    Closed,
    /// The board's DTR pin could not be set.
    #[error("DTR pin error")]
    DtrPin,
}

/// What the caller should do after a failure. The timing (a jittered backoff) is the caller's
/// policy; this is only the kind of wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Class {
    /// Transient: no network yet, the call was refused, a line error. Redial after a backoff.
    RetryLater,
    /// The modem does not answer, or the port is dead: reset or power-cycle the modem if the
    /// board can, then redial after a backoff.
    ResetModem,
    /// The configuration or the SIM is wrong (a bad APN refused by `AT+CGDCONT`, a SIM that
    /// needs a PIN or is missing, a subscription without data). Redialing will not help until
    /// a person changes something: report it, and retry only on a long period.
    FixConfiguration,
}

/// A failed dial or hang-up: the step, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[error("{step}: {failure}")]
pub struct DialError {
    /// The step that failed.
    pub step: Step,
    /// Why it failed.
    pub failure: Failure,
}

impl DialError {
    /// The kind of wait worth making before the next dial.
    pub fn class(&self) -> Class {
        use Failure as F;
        match (self.step, self.failure) {
            // A dead port or a modem that never answers needs more than patience.
            (_, F::Closed | F::WriteZero | F::WriteStalled | F::DtrPin) => Class::ResetModem,
            (Step::Probe | Step::HangUp, F::Silence | F::Unanswered | F::Error) => Class::ResetModem,
            (_, F::Cme(CmeError::Code(code))) if cme_needs_a_person(code) => Class::FixConfiguration,
            // The modem refused our context or DTR setting: the APN (or the board's choice of
            // hang-up) is wrong for it, not the network.
            (Step::DefineContext | Step::DtrMode, F::Error | F::Cme(_)) => Class::FixConfiguration,
            _ => Class::RetryLater,
        }
    }

    /// True when the modem may still be (or may yet go) in data mode: hang up before the next
    /// dial, or its `AT` probes are sent to the network as data. A dial that timed out may still
    /// connect later; a modem whose PPP session died without `NO CARRIER` stays online, where it
    /// forwards `AT` silently or answers with PPP frames.
    pub fn may_be_online(&self) -> bool {
        matches!(
            (self.step, self.failure),
            (Step::Dial | Step::Probe, Failure::Silence | Failure::Unanswered)
        )
    }
}

/// `+CME ERROR` codes (3GPP TS 27.007, 9.2) that no redial fixes: the SIM is missing, locked or
/// wrong, or the subscription refuses data or this APN.
fn cme_needs_a_person(code: u16) -> bool {
    matches!(
        code,
        // PH-SIM/PH-FSIM PIN and PUK, SIM not inserted, SIM PIN/PUK required, SIM failure.
        5..=7 | 10..=13
        // SIM wrong, incorrect password, SIM PIN2/PUK2 required.
        | 15..=18
        // Network and service-provider personalisation PINs and PUKs.
        | 40..=48
        // Illegal MS, illegal ME, GPRS services not allowed.
        | 103 | 106 | 107
        // Service option not supported, requested service option not subscribed (an APN the
        // subscription does not have), PDP authentication failure.
        | 132 | 133 | 149
    )
}

/// The modem is in data mode: hand the port to PPP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Connected {
    /// The rate from `CONNECT <rate>`, in bits per second, when the modem gave a number.
    pub rate: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(step: Step, failure: Failure) -> Class {
        DialError { step, failure }.class()
    }

    #[test]
    fn a_refused_context_is_configuration_not_weather() {
        assert_eq!(class(Step::DefineContext, Failure::Error), Class::FixConfiguration);
        assert_eq!(class(Step::DefineContext, Failure::Cme(CmeError::Verbose)), Class::FixConfiguration);
        assert_eq!(class(Step::Dial, Failure::Error), Class::RetryLater);
        assert_eq!(class(Step::DefineContext, Failure::Silence), Class::RetryLater);
    }

    #[test]
    fn cme_codes_split_between_sim_problems_and_network_weather() {
        for code in [10, 11, 12, 13, 16, 103, 107, 133, 149] {
            assert_eq!(
                class(Step::Dial, Failure::Cme(CmeError::Code(code))),
                Class::FixConfiguration,
                "{code}"
            );
        }
        for code in [14, 30, 31, 32, 100, 112, 134, 148] {
            assert_eq!(class(Step::Dial, Failure::Cme(CmeError::Code(code))), Class::RetryLater, "{code}");
        }
        assert_eq!(class(Step::Dial, Failure::Cme(CmeError::Verbose)), Class::RetryLater);
    }

    #[test]
    fn call_setup_refusals_are_retried_later() {
        for f in [
            Failure::NoCarrier,
            Failure::Busy,
            Failure::NoDialtone,
            Failure::NoAnswer,
            Failure::OkWithoutConnect,
            Failure::Silence,
            Failure::Read(ErrorKind::Other),
            Failure::Write(ErrorKind::Other),
        ] {
            assert_eq!(class(Step::Dial, f), Class::RetryLater, "{f:?}");
        }
    }

    #[test]
    fn an_unresponsive_modem_or_dead_port_asks_for_a_reset() {
        assert_eq!(class(Step::Probe, Failure::Silence), Class::ResetModem);
        assert_eq!(class(Step::Probe, Failure::Unanswered), Class::ResetModem);
        assert_eq!(class(Step::HangUp, Failure::Silence), Class::ResetModem);
        assert_eq!(class(Step::EchoOff, Failure::Closed), Class::ResetModem);
        assert_eq!(class(Step::Dial, Failure::WriteZero), Class::ResetModem);
        assert_eq!(class(Step::Dtr, Failure::DtrPin), Class::ResetModem);
    }

    #[test]
    fn only_timeouts_that_may_have_left_the_modem_online_say_so() {
        assert!(DialError { step: Step::Dial, failure: Failure::Silence }.may_be_online());
        assert!(DialError { step: Step::Probe, failure: Failure::Unanswered }.may_be_online());
        assert!(DialError { step: Step::Probe, failure: Failure::Silence }.may_be_online());
        assert!(!DialError { step: Step::Dial, failure: Failure::NoCarrier }.may_be_online());
        assert!(!DialError { step: Step::Probe, failure: Failure::Closed }.may_be_online());
        assert!(!DialError { step: Step::HangUp, failure: Failure::Silence }.may_be_online());
    }

    #[test]
    fn display_names_the_step_and_the_code_only() {
        let e = DialError { step: Step::DefineContext, failure: Failure::Cme(CmeError::Code(30)) };
        assert_eq!(std::format!("{e}"), "define_context: +CME ERROR: 30");
    }
}

//! The board's hook for hanging up with the modem's DTR line instead of the escape sequence.

use embedded_hal::digital::OutputPin;

/// A DTR output the chat can drive. Implemented for [`DtrPin`]; a board with DTR behind an I/O
/// expander or a level shifter implements it itself.
pub trait Dtr {
    /// The pin's error; the chat reports it as [`Failure::DtrPin`](crate::Failure::DtrPin).
    type Error;

    /// Drives DTR on (`ready`, the terminal is ready) or off.
    fn set_ready(&mut self, ready: bool) -> Result<(), Self::Error>;
}

/// A GPIO wired to the modem's DTR input, with its polarity.
///
/// Modules' logic-level DTR inputs are commonly active low (low = ready); the module's hardware
/// guide says which.
#[derive(Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct DtrPin<P> {
    pin: P,
    active_low: bool,
}

impl<P: OutputPin> DtrPin<P> {
    /// Low means ready.
    pub const fn active_low(pin: P) -> Self {
        Self { pin, active_low: true }
    }

    /// High means ready.
    pub const fn active_high(pin: P) -> Self {
        Self { pin, active_low: false }
    }

    /// Gives the pin back.
    pub fn into_inner(self) -> P {
        self.pin
    }
}

impl<P: OutputPin> Dtr for DtrPin<P> {
    type Error = P::Error;

    fn set_ready(&mut self, ready: bool) -> Result<(), Self::Error> {
        if ready != self.active_low { self.pin.set_high() } else { self.pin.set_low() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::convert::Infallible;

    #[derive(Default)]
    struct Pin {
        high: Option<bool>,
    }

    impl embedded_hal::digital::ErrorType for Pin {
        type Error = Infallible;
    }

    impl OutputPin for Pin {
        fn set_low(&mut self) -> Result<(), Infallible> {
            self.high = Some(false);
            Ok(())
        }
        fn set_high(&mut self) -> Result<(), Infallible> {
            self.high = Some(true);
            Ok(())
        }
    }

    #[test]
    fn polarity_maps_ready_to_the_right_level() {
        let mut low = DtrPin::active_low(Pin::default());
        low.set_ready(true).unwrap();
        assert_eq!(low.pin.high, Some(false));
        low.set_ready(false).unwrap();
        assert_eq!(low.pin.high, Some(true));

        let mut high = DtrPin::active_high(Pin::default());
        high.set_ready(true).unwrap();
        assert_eq!(high.into_inner().high, Some(true));
    }
}

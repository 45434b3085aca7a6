//! The chat: dial the modem into PPP data mode, and hang it up again.
//!
//! ```text
//! → AT\r                          ← OK            (up to `probe_tries` times)
//! → ATE0\r                        ← OK            (an echoed `ATE0` is skipped)
//! → AT&D2\r                       ← OK            (only with HangUp::Dtr)
//! → AT+CGDCONT=1,"IP","<apn>"\r   ← OK
//! → ATD*99#\r                     ← CONNECT[ <rate>]   → the port now carries PPP
//!
//! hang-up: (guard) → +++ (guard) ← OK | NO CARRIER | nothing; → ATH\r ← OK (two tries)
//!      or: DTR off, wait, DTR on; → ATH\r ← OK
//! ```
//!
//! Every step has a deadline; every read and write of the port runs under it. Bytes are read
//! one at a time so the chat never takes a byte past the `CONNECT` line's `\r`: what follows
//! belongs to PPP (whose frame reader skips the `\n` still waiting before its first flag).

use embassy_time::{Duration, Instant, Timer, with_deadline};
use embedded_io_async::{Error as _, Read, Write};

use crate::config::{Config, HangUp, MAX_ZERO_IO};
use crate::dtr::Dtr;
use crate::line::{Code, Event, LineReader, classify};
use crate::outcome::{Connected, DialError, Failure, Step};
use crate::stats::{Stats, bump};

const PROBE: &[u8] = b"AT\r";
const ECHO_OFF: &[u8] = b"ATE0\r";
const DTR_HANGS_UP: &[u8] = b"AT&D2\r";
/// Context 1, PDP type "IP": PPP on this link negotiates IPv4 only.
const DEFINE_CONTEXT_HEAD: &[u8] = b"AT+CGDCONT=1,\"IP\",\"";
const DEFINE_CONTEXT_TAIL: &[u8] = b"\"\r";
/// The 3GPP packet-domain dial string: start PPP on the default context.
const DIAL: &[u8] = b"ATD*99#\r";
const ESCAPE: &[u8] = b"+++";
const HANG_UP: &[u8] = b"ATH\r";
/// The first `ATH` after `+++` may reach a modem that was already in command mode, where the
/// `+++` sits in front of it and the line draws `ERROR`; the second try is a clean line.
const HANG_UP_TRIES: u8 = 2;

/// What a step waits for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Want {
    Ok,
    Connect,
}

/// The dial-up chat over one modem.
///
/// Holds the configuration, a fixed line buffer and [`Stats`]; the port is lent to each call,
/// so the same port can be handed to PPP between a [`dial`](Chat::dial) and a
/// [`hang_up`](Chat::hang_up).
#[derive(Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Chat<'a> {
    config: Config<'a>,
    stats: Stats,
    line: LineReader,
    /// Zero-byte reads in a row, across the steps of one call.
    zero_reads: u32,
}

impl<'a> Chat<'a> {
    /// A chat with this configuration; nothing is sent yet.
    pub const fn new(config: Config<'a>) -> Self {
        Self { config, stats: Stats::default_const(), line: LineReader::new(), zero_reads: 0 }
    }

    /// The configuration.
    pub const fn config(&self) -> &Config<'a> {
        &self.config
    }

    /// What the chat has counted so far.
    pub const fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Brings the modem from command mode into PPP data mode.
    ///
    /// On `Ok` the port carries PPP: hand it to the PPP runner. On `Err`, the failed step and
    /// why; [`DialError::class`] says what kind of wait is worth it, and
    /// [`DialError::may_be_online`] whether to [`hang_up`](Chat::hang_up) first. Whatever the
    /// modem does, this returns within [`Config::dial_bound`].
    pub async fn dial<P: Read + Write>(&mut self, port: &mut P) -> Result<Connected, DialError> {
        self.begin();
        let result = self.dial_steps(port).await;
        match &result {
            Ok(_) => debug!("dial: connected"),
            Err(e) => warn!("dial: {} failed: {}", e.step, e.failure),
        }
        result
    }

    /// Leaves data mode with the escape sequence and hangs up: a second of silence, `+++`, a
    /// second of silence (waiting for the modem's `OK`, or its `NO CARRIER` if the call had
    /// already dropped), then `ATH`.
    ///
    /// Stop the PPP runner first: the silence before `+++` is what makes the modem take it for
    /// an escape rather than data. Returns within [`Config::hang_up_bound`].
    pub async fn hang_up<P: Read + Write>(&mut self, port: &mut P) -> Result<(), DialError> {
        self.begin();
        let result = self.escape_and_hang_up(port).await;
        match &result {
            Ok(()) => debug!("hang_up: done"),
            Err(e) => warn!("hang_up: {} failed: {}", e.step, e.failure),
        }
        result
    }

    /// Hangs up by dropping DTR for [`Timeouts::dtr_off`](crate::Timeouts::dtr_off), then
    /// confirms command mode with `ATH`. The dial must have sent `AT&D2`
    /// ([`HangUp::Dtr`]). Returns within [`Config::hang_up_dtr_bound`].
    pub async fn hang_up_dtr<P: Read + Write, D: Dtr>(
        &mut self,
        port: &mut P,
        dtr: &mut D,
    ) -> Result<(), DialError> {
        self.begin();
        let dtr_failed = DialError { step: Step::Dtr, failure: Failure::DtrPin };
        dtr.set_ready(false).map_err(|_| dtr_failed)?;
        Timer::at(Instant::now().saturating_add(self.config.timeouts.dtr_off)).await;
        dtr.set_ready(true).map_err(|_| dtr_failed)?;
        let result = self.hang_up_command(port).await;
        if let Err(e) = &result {
            warn!("hang_up_dtr: {} failed: {}", e.step, e.failure);
        }
        result
    }

    fn begin(&mut self) {
        self.zero_reads = 0;
        self.line.clear();
    }

    async fn dial_steps<P: Read + Write>(&mut self, port: &mut P) -> Result<Connected, DialError> {
        let command = self.config.timeouts.command;
        self.probe(port).await?;
        self.step(port, Step::EchoOff, &[ECHO_OFF], Want::Ok, command).await?;
        if self.config.hang_up == HangUp::Dtr {
            self.step(port, Step::DtrMode, &[DTR_HANGS_UP], Want::Ok, command).await?;
        }
        let apn = self.config.apn.as_bytes();
        let define = [DEFINE_CONTEXT_HEAD, apn, DEFINE_CONTEXT_TAIL];
        self.step(port, Step::DefineContext, &define, Want::Ok, command).await?;
        let dial = self.config.timeouts.dial;
        let rate = self.step(port, Step::Dial, &[DIAL], Want::Connect, dial).await?;
        Ok(Connected { rate })
    }

    /// `AT` until `OK`. A modem that is still booting, or that was left with junk in its line
    /// buffer, may miss a probe or answer `ERROR`: only a dead port ends the probing early.
    async fn probe<P: Read + Write>(&mut self, port: &mut P) -> Result<(), DialError> {
        let timeout = self.config.timeouts.probe;
        let mut last = Failure::Silence;
        for attempt in 0..self.config.probe_tries.get() {
            match self.exchange(port, &[PROBE], Want::Ok, timeout).await {
                Ok(_) => {
                    if attempt > 0 {
                        // A missed probe's own OK may still be on its way: let it arrive and
                        // drop it here, or it would answer the next command.
                        self.drain(port, timeout).await.map_err(|f| at(Step::Probe, f))?;
                    }
                    return Ok(());
                }
                Err(f @ (Failure::Silence | Failure::Unanswered | Failure::Error | Failure::Cme(_))) => {
                    bump(&mut self.stats.probe_misses);
                    last = f;
                }
                Err(f) => return Err(at(Step::Probe, f)),
            }
        }
        Err(at(Step::Probe, last))
    }

    async fn escape_and_hang_up<P: Read + Write>(&mut self, port: &mut P) -> Result<(), DialError> {
        let t = self.config.timeouts;
        let guard = t.effective_guard();
        // Silence before: only a pause in the data turns `+++` into an escape.
        Timer::at(Instant::now().saturating_add(guard)).await;
        let write_by = Instant::now().saturating_add(t.command);
        self.send(port, &[ESCAPE], write_by).await.map_err(|f| at(Step::Escape, f))?;
        let sent = Instant::now();
        let answer_by = sent.saturating_add(guard.checked_mul(2).unwrap_or(Duration::MAX));
        let answered = self.await_escape(port, answer_by).await.map_err(|f| at(Step::Escape, f))?;
        if !answered {
            bump(&mut self.stats.escapes_unanswered);
            debug!("hang_up: escape unanswered");
        }
        // Silence after, whatever the modem said: a command sent sooner reads as data.
        Timer::at(sent.saturating_add(guard)).await;
        self.hang_up_command(port).await
    }

    /// After `+++`: `OK` (escaped to command mode) or `NO CARRIER` (the call had dropped and the
    /// modem was in command mode already) end the wait; `false` when neither came in time.
    async fn await_escape<P: Read>(&mut self, port: &mut P, deadline: Instant) -> Result<bool, Failure> {
        loop {
            let Some(byte) = self.read_byte(port, deadline).await? else {
                return Ok(false);
            };
            match self.line.push(byte) {
                None => {}
                Some(Event::Garbage) => bump(&mut self.stats.garbage),
                Some(Event::Overlong) => bump(&mut self.stats.overlong),
                Some(Event::Text(text)) => match classify(text) {
                    Code::Ok | Code::NoCarrier => return Ok(true),
                    _ => bump(&mut self.stats.noise),
                },
            }
        }
    }

    async fn hang_up_command<P: Read + Write>(&mut self, port: &mut P) -> Result<(), DialError> {
        let timeout = self.config.timeouts.command;
        let mut last = Failure::Silence;
        for _ in 0..HANG_UP_TRIES {
            match self.exchange(port, &[HANG_UP], Want::Ok, timeout).await {
                Ok(_) => return Ok(()),
                Err(f @ (Failure::Silence | Failure::Unanswered | Failure::Error | Failure::Cme(_))) => {
                    last = f;
                }
                Err(f) => return Err(at(Step::HangUp, f)),
            }
        }
        Err(at(Step::HangUp, last))
    }

    /// One command as a named step.
    async fn step<P: Read + Write>(
        &mut self,
        port: &mut P,
        step: Step,
        command: &[&[u8]],
        want: Want,
        timeout: Duration,
    ) -> Result<Option<u32>, DialError> {
        let result = self.exchange(port, command, want, timeout).await;
        if result.is_ok() {
            debug!("dial: {} ok", step);
        }
        result.map_err(|f| at(step, f))
    }

    /// Sends `command` (its pieces in order, the last ending in `\r`) and reads lines until the
    /// final result code `want`s, or a failing one, or the deadline. `Ok(rate)` carries the
    /// `CONNECT` rate (always `None` for `OK`).
    async fn exchange<P: Read + Write>(
        &mut self,
        port: &mut P,
        command: &[&[u8]],
        want: Want,
        timeout: Duration,
    ) -> Result<Option<u32>, Failure> {
        let deadline = Instant::now().saturating_add(timeout);
        self.line.clear();
        self.send(port, command, deadline).await?;
        let mut heard = false;
        loop {
            let Some(byte) = self.read_byte(port, deadline).await? else {
                return Err(if heard { Failure::Unanswered } else { Failure::Silence });
            };
            // The `\n` left behind by the last reply's `\r` is no answer to this command.
            heard |= !matches!(byte, b'\r' | b'\n');
            let text = match self.line.push(byte) {
                None => continue,
                Some(Event::Garbage) => {
                    bump(&mut self.stats.garbage);
                    continue;
                }
                Some(Event::Overlong) => {
                    bump(&mut self.stats.overlong);
                    continue;
                }
                Some(Event::Text(text)) => text,
            };
            if is_echo(text, command) {
                bump(&mut self.stats.echoes);
                continue;
            }
            match (classify(text), want) {
                (Code::Ok, Want::Ok) => return Ok(None),
                (Code::Connect(rate), Want::Connect) => return Ok(rate),
                (Code::Ok, Want::Connect) => return Err(Failure::OkWithoutConnect),
                (Code::Error, _) => return Err(Failure::Error),
                (Code::Cme(e), _) => return Err(Failure::Cme(e)),
                (Code::NoCarrier, Want::Connect) => return Err(Failure::NoCarrier),
                (Code::Busy, Want::Connect) => return Err(Failure::Busy),
                (Code::NoDialtone, Want::Connect) => return Err(Failure::NoDialtone),
                (Code::NoAnswer, Want::Connect) => return Err(Failure::NoAnswer),
                // Unsolicited codes, and call-progress codes outside a dial (a NO CARRIER left
                // over from the last call), answer nothing here.
                _ => bump(&mut self.stats.noise),
            }
        }
    }

    /// Reads and drops whatever arrives until the port has been quiet for an idle pause, or
    /// until `limit`.
    async fn drain<P: Read>(&mut self, port: &mut P, limit: Duration) -> Result<(), Failure> {
        let end = Instant::now().saturating_add(limit);
        loop {
            let quiet_by = Instant::now().saturating_add(self.config.timeouts.idle_pause);
            let deadline = if quiet_by < end { quiet_by } else { end };
            let Some(byte) = self.read_byte(port, deadline).await? else {
                return Ok(());
            };
            match self.line.push(byte) {
                None => {}
                Some(Event::Garbage) => bump(&mut self.stats.garbage),
                Some(Event::Overlong) => bump(&mut self.stats.overlong),
                Some(Event::Text(_)) => bump(&mut self.stats.noise),
            }
        }
    }

    /// Writes every piece and flushes, all by `deadline`.
    async fn send<P: Write>(
        &mut self,
        port: &mut P,
        pieces: &[&[u8]],
        deadline: Instant,
    ) -> Result<(), Failure> {
        for piece in pieces {
            self.write_all(port, piece, deadline).await?;
        }
        match with_deadline(deadline, port.flush()).await {
            Err(_) => return Err(Failure::WriteStalled),
            Ok(Err(e)) => return Err(Failure::Write(e.kind())),
            Ok(Ok(())) => {}
        }
        bump(&mut self.stats.commands);
        Ok(())
    }

    /// Like `Write::write_all`, which panics on a zero-byte write; here a port that takes
    /// nothing is paused on, counted, and given up on.
    async fn write_all<P: Write>(
        &mut self,
        port: &mut P,
        mut bytes: &[u8],
        deadline: Instant,
    ) -> Result<(), Failure> {
        let mut zero_in_row: u32 = 0;
        while !bytes.is_empty() {
            if Instant::now() >= deadline {
                return Err(Failure::WriteStalled);
            }
            match with_deadline(deadline, port.write(bytes)).await {
                Err(_) => return Err(Failure::WriteStalled),
                Ok(Err(e)) => return Err(Failure::Write(e.kind())),
                Ok(Ok(0)) => {
                    bump(&mut self.stats.zero_writes);
                    zero_in_row = zero_in_row.saturating_add(1);
                    if zero_in_row >= MAX_ZERO_IO {
                        return Err(Failure::WriteZero);
                    }
                    self.pause(deadline).await;
                }
                // A port that claims more than it was given wrote it all.
                Ok(Ok(n)) => bytes = bytes.get(n..).unwrap_or_default(),
            }
        }
        Ok(())
    }

    /// One byte, `None` at the deadline. The deadline is checked before every read, so even a
    /// port that always has a byte ready cannot keep the chat past it.
    async fn read_byte<P: Read>(&mut self, port: &mut P, deadline: Instant) -> Result<Option<u8>, Failure> {
        loop {
            if Instant::now() >= deadline {
                return Ok(None);
            }
            let mut buf = [0u8; 1];
            match with_deadline(deadline, port.read(&mut buf)).await {
                Err(_) => return Ok(None),
                Ok(Err(e)) => return Err(Failure::Read(e.kind())),
                Ok(Ok(0)) => {
                    // End of stream, which a UART never reports: pause, count, and give up
                    // after a few rather than spin on it.
                    bump(&mut self.stats.zero_reads);
                    self.zero_reads = self.zero_reads.saturating_add(1);
                    if self.zero_reads >= MAX_ZERO_IO {
                        return Err(Failure::Closed);
                    }
                    self.pause(deadline).await;
                }
                Ok(Ok(_)) => {
                    self.zero_reads = 0;
                    let [byte] = buf;
                    return Ok(Some(byte));
                }
            }
        }
    }

    /// The idle pause, cut short at the deadline.
    async fn pause(&self, deadline: Instant) {
        let until = Instant::now().saturating_add(self.config.timeouts.idle_pause);
        Timer::at(if until < deadline { until } else { deadline }).await;
    }
}

fn at(step: Step, failure: Failure) -> DialError {
    DialError { step, failure }
}

/// True when `line` is the command itself, `\r` aside: the modem's echo.
fn is_echo(line: &[u8], command: &[&[u8]]) -> bool {
    let sent = command.iter().flat_map(|piece| piece.iter()).filter(|b| **b != b'\r');
    line.iter().eq(sent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_matches_the_whole_command_only() {
        assert!(is_echo(b"ATE0", &[ECHO_OFF]));
        assert!(is_echo(b"AT+CGDCONT=1,\"IP\",\"em\"", &[DEFINE_CONTEXT_HEAD, b"em", DEFINE_CONTEXT_TAIL]));
        assert!(!is_echo(b"AT+CGDCONT=1,\"IP\",\"e\"", &[DEFINE_CONTEXT_HEAD, b"em", DEFINE_CONTEXT_TAIL]));
        assert!(!is_echo(b"AT", &[ECHO_OFF]));
        assert!(!is_echo(b"OK", &[PROBE]));
    }
}

//! The chat against a scripted modem over an in-memory serial pair, on embassy-time's mock
//! clock: every outcome is typed, and every wait is measured in exact virtual milliseconds.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

mod support;

use embassy_time::{Duration, Instant, Timer};
use embedded_io_async::ErrorKind;
use support::{Exchange, Port, RecordingDtr, Reply, happy, lines, on, run};
use wary_dial::{Apn, Chat, Class, CmeError, Config, Connected, DialError, Failure, HangUp, Step, Timeouts};

const CGDCONT: &str = "AT+CGDCONT=1,\"IP\",\"internet\"";

fn config() -> Config<'static> {
    Config::new(Apn::new("internet").unwrap())
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Dials against `script` from time zero.
fn dial(port: &Port, config: Config<'static>) -> (Result<Connected, DialError>, Duration, Chat<'static>) {
    let mut p = port.clone();
    let ((result, chat), took) = run(|| async move {
        let mut chat = Chat::new(config);
        let result = chat.dial(&mut p).await;
        (result, chat)
    });
    assert!(took <= config.dial_bound(), "took {took:?}, bound {:?}", config.dial_bound());
    (result, took, chat)
}

fn failed(step: Step, failure: Failure) -> Result<Connected, DialError> {
    Err(DialError { step, failure })
}

#[test]
fn happy_path_connects_and_sends_exact_commands() {
    let mut script = happy(CGDCONT);
    // PPP's first frame follows CONNECT at once: the chat must leave it (and the `\n`) unread.
    script[3] = on("ATD*99#", Reply::Raw(b"\r\nCONNECT 150000000\r\n\x7e\xff\x7d\x23".to_vec()));
    let port = Port::new(script);
    let (result, took, chat) = dial(&port, config());
    assert_eq!(result, Ok(Connected { rate: Some(150_000_000) }));
    assert_eq!(took, ms(0));
    let wire: Vec<u8> = port.0.borrow().writes.iter().flat_map(|(_, b)| b.clone()).collect();
    assert_eq!(wire, b"AT\rATE0\rAT+CGDCONT=1,\"IP\",\"internet\"\rATD*99#\r");
    assert_eq!(port.unread(), b"\n\x7e\xff\x7d\x23");
    assert_eq!(port.script_left(), 0);
    let stats = chat.stats();
    assert_eq!((stats.commands, stats.echoes, stats.noise, stats.garbage), (4, 0, 0, 0));
}

#[test]
fn connect_without_a_rate_and_an_empty_apn() {
    let port = Port::new(vec![
        on("AT", lines(&["OK"])),
        on("ATE0", lines(&["OK"])),
        on("AT+CGDCONT=1,\"IP\",\"\"", lines(&["OK"])),
        on("ATD*99#", lines(&["CONNECT"])),
    ]);
    let (result, _, _) = dial(&port, Config::new(Apn::new("").unwrap()));
    assert_eq!(result, Ok(Connected { rate: None }));
}

#[test]
fn echo_left_on_is_skipped() {
    // A modem that ignores ATE0 echoes all four commands.
    let port = Port::new(happy(CGDCONT)).with_echo();
    let (result, took, chat) = dial(&port, config());
    assert_eq!(result, Ok(Connected { rate: Some(150_000_000) }));
    assert_eq!(took, ms(0));
    assert_eq!(chat.stats().echoes, 4);
    assert_eq!(chat.stats().noise, 0);

    // One that obeys echoes only AT and ATE0.
    let mut script = happy(CGDCONT);
    script[1] = on("ATE0", Reply::Seq(vec![Reply::Echo(false), lines(&["OK"])]));
    let port = Port::new(script).with_echo();
    let (result, _, chat) = dial(&port, config());
    assert!(result.is_ok());
    assert_eq!(chat.stats().echoes, 2);
}

#[test]
fn echo_without_result_is_unanswered() {
    let port = Port::new(vec![on("AT", lines(&["OK"])), on("ATE0", Reply::Silence)]).with_echo();
    let (result, took, chat) = dial(&port, config());
    assert_eq!(result, failed(Step::EchoOff, Failure::Unanswered));
    assert_eq!(took, ms(5000));
    assert_eq!(chat.stats().echoes, 2);
}

#[test]
fn error_on_define_context_is_a_configuration_error() {
    let port =
        Port::new(vec![on("AT", lines(&["OK"])), on("ATE0", lines(&["OK"])), on(CGDCONT, lines(&["ERROR"]))]);
    let (result, took, _) = dial(&port, config());
    let err = result.unwrap_err();
    assert_eq!(err, DialError { step: Step::DefineContext, failure: Failure::Error });
    assert_eq!(err.class(), Class::FixConfiguration);
    assert!(!err.may_be_online());
    assert_eq!(took, ms(0));
    // Nothing is dialed after a refused context.
    assert_eq!(port.commands(), ["AT", "ATE0", CGDCONT]);
}

#[test]
fn dial_refusals_are_typed() {
    let cases = [
        ("NO CARRIER", Failure::NoCarrier),
        ("BUSY", Failure::Busy),
        ("NO DIALTONE", Failure::NoDialtone),
        ("NO DIAL TONE", Failure::NoDialtone),
        ("NO ANSWER", Failure::NoAnswer),
        ("OK", Failure::OkWithoutConnect),
        ("ERROR", Failure::Error),
    ];
    for (code, failure) in cases {
        let mut script = happy(CGDCONT);
        script[3] = on("ATD*99#", Reply::After(ms(2500), Box::new(lines(&[code]))));
        let port = Port::new(script);
        let (result, took, _) = dial(&port, config());
        let err = result.unwrap_err();
        assert_eq!(err, DialError { step: Step::Dial, failure }, "{code}");
        assert_eq!(err.class(), Class::RetryLater, "{code}");
        assert!(!err.may_be_online(), "{code}");
        assert_eq!(took, ms(2500), "{code}");
    }
}

#[test]
fn cme_error_30_is_retried_later() {
    let mut script = happy(CGDCONT);
    script[3] = on("ATD*99#", lines(&["+CME ERROR: 30"]));
    let port = Port::new(script);
    let (result, took, _) = dial(&port, config());
    let err = result.unwrap_err();
    assert_eq!(err, DialError { step: Step::Dial, failure: Failure::Cme(CmeError::Code(30)) });
    assert_eq!(err.class(), Class::RetryLater);
    assert_eq!(took, ms(0));
}

#[test]
fn cme_sim_pin_needs_a_person_and_verbose_text_is_dropped() {
    let mut script = happy(CGDCONT);
    script[3] = on("ATD*99#", lines(&["+CME ERROR: 11"]));
    let (result, _, _) = dial(&Port::new(script), config());
    let err = result.unwrap_err();
    assert_eq!(err.failure, Failure::Cme(CmeError::Code(11)));
    assert_eq!(err.class(), Class::FixConfiguration);

    let mut script = happy(CGDCONT);
    script[2] = on(CGDCONT, lines(&["+CME ERROR: requested service option not subscribed"]));
    let (result, _, _) = dial(&Port::new(script), config());
    let err = result.unwrap_err();
    assert_eq!(err, DialError { step: Step::DefineContext, failure: Failure::Cme(CmeError::Verbose) });
    assert_eq!(err.class(), Class::FixConfiguration);
}

#[test]
fn silence_at_each_step_ends_at_its_deadline() {
    // Every probe unanswered: 5 tries of 1 s.
    let port = Port::new((0..5).map(|_| on("AT", Reply::Silence)).collect());
    let (result, took, chat) = dial(&port, config());
    let err = result.unwrap_err();
    assert_eq!(err, DialError { step: Step::Probe, failure: Failure::Silence });
    assert_eq!(err.class(), Class::ResetModem);
    assert!(err.may_be_online());
    assert_eq!(took, ms(5000));
    assert_eq!(chat.stats().probe_misses, 5);
    assert_eq!(port.commands().len(), 5);
    let probes = port.command_time("AT");
    assert_eq!(probes, (0..5).map(|i| Instant::from_millis(i * 1000)).collect::<Vec<_>>());

    // Then each later step silent in turn.
    let steps: [(usize, Step, u64); 3] =
        [(1, Step::EchoOff, 5000), (2, Step::DefineContext, 5000), (3, Step::Dial, 60_000)];
    for (at, step, limit) in steps {
        let mut script = happy(CGDCONT);
        script[at].reply = Reply::Silence;
        script.truncate(at + 1);
        let port = Port::new(script);
        let (result, took, _) = dial(&port, config());
        let err = result.unwrap_err();
        assert_eq!(err, DialError { step, failure: Failure::Silence });
        assert_eq!(err.class(), Class::RetryLater);
        assert_eq!(err.may_be_online(), step == Step::Dial);
        assert_eq!(took, ms(limit), "{step}");
    }

    // Shorter limits are honoured exactly too.
    let short = Timeouts { probe: ms(250), command: ms(700), dial: ms(9000), ..Timeouts::DEFAULT };
    let mut script = happy(CGDCONT);
    script[3].reply = Reply::Silence;
    let (result, took, _) = dial(&Port::new(script), config().with_timeouts(short));
    assert_eq!(result, failed(Step::Dial, Failure::Silence));
    assert_eq!(took, ms(9000));
}

#[test]
fn late_probe_answer_is_drained_not_misattributed() {
    // The first probe's OK comes 50 ms after its deadline, while the second probe is answered
    // at once. Taken for ATE0's answer, it would push ATE0's ERROR onto the next command and
    // turn a modem fault into a "bad APN".
    let port = Port::new(vec![
        on("AT", Reply::After(ms(1050), Box::new(lines(&["OK"])))),
        on("AT", lines(&["OK"])),
        on("ATE0", Reply::After(ms(200), Box::new(lines(&["ERROR"])))),
        on(CGDCONT, lines(&["OK"])),
    ]);
    let (result, took, chat) = dial(&port, config());
    let err = result.unwrap_err();
    assert_eq!(err, DialError { step: Step::EchoOff, failure: Failure::Error });
    assert_eq!(err.class(), Class::RetryLater);
    assert_eq!(chat.stats().noise, 1);
    assert_eq!(chat.stats().probe_misses, 1);
    // 1 s missed probe, 50 ms to the late OK, 100 ms of quiet, 200 ms for ATE0's answer.
    assert_eq!(took, ms(1350));
}

#[test]
fn garbage_and_unsolicited_noise_are_skipped() {
    let port = Port::new(vec![
        on(
            "AT",
            Reply::Seq(vec![
                Reply::Raw(b"\x00\xff\xfe\x7e\x13".to_vec()),
                lines(&["RING"]),
                Reply::Raw(b"\r\n\x80\x81garbage\r\n".to_vec()),
                lines(&["+CREG: 2", "OK"]),
            ]),
        ),
        // Call-progress codes outside a dial are noise, not failures.
        on("ATE0", lines(&["BUSY", "+CREG: 1", "OK"])),
        on(CGDCONT, Reply::Seq(vec![Reply::Raw(b"\x1b[0m\x07\r".to_vec()), lines(&["OK"])])),
        on("ATD*99#", lines(&["RING", "+CREG: 5", "CONNECT 115200"])),
    ]);
    // A NO CARRIER left over from the last call waits in the port before the first probe.
    let p = port.clone();
    let (result, chat) = {
        let config = config();
        let ((result, chat), took) = run(|| async move {
            let mut p = p;
            p.push_unsolicited(b"\r\nNO CARRIER\r\n");
            let mut chat = Chat::new(config);
            (chat.dial(&mut p).await, chat)
        });
        assert_eq!(took, ms(0));
        (result, chat)
    };
    assert_eq!(result, Ok(Connected { rate: Some(115_200) }));
    let stats = chat.stats();
    assert_eq!(stats.garbage, 3);
    // NO CARRIER, RING, +CREG: 2, BUSY, +CREG: 1, RING, +CREG: 5.
    assert_eq!(stats.noise, 7);
}

#[test]
fn endless_garbage_is_bounded_by_the_deadline() {
    let flood: Vec<Reply> = (0..1000)
        .map(|i| Reply::After(ms(i * 10), Box::new(Reply::Raw(b"\x7e\xff\x03\xc0\x21".to_vec()))))
        .collect();
    let mut script = happy(CGDCONT);
    script[1].reply = Reply::Seq(flood);
    script.truncate(2);
    let (result, took, chat) = dial(&Port::new(script), config());
    assert_eq!(result, failed(Step::EchoOff, Failure::Unanswered));
    assert_eq!(took, ms(5000));
    // No terminator ever came, so no line was finished: nothing was kept either.
    assert_eq!(chat.stats().garbage, 0);
}

#[test]
fn flood_at_line_rate_is_bounded_by_the_deadline() {
    // A byte always ready: only the chat's own deadline check can end the step.
    let mut script = happy(CGDCONT);
    script[1].reply = Reply::Stream(b"RING\r\n\x7e\xff\r\n".to_vec());
    script.truncate(2);
    let (result, took, chat) = dial(&Port::new(script), config());
    assert_eq!(result, failed(Step::EchoOff, Failure::Unanswered));
    assert_eq!(took, ms(5000));
    // 5000 bytes of 10-byte cycles: 500 RINGs and 500 garbage lines, counted and dropped.
    assert_eq!((chat.stats().noise, chat.stats().garbage), (500, 500));
}

#[test]
fn overlong_line_is_dropped_and_counted() {
    let mut tail_is_error = vec![b'X'; 200];
    tail_is_error.extend_from_slice(b"ERROR\r\n");
    let mut script = happy(CGDCONT);
    script[0].reply = Reply::Seq(vec![Reply::Overlong(500), lines(&["OK"])]);
    // The tail of an overlong line must not be read as a result code of its own.
    script[2].reply = Reply::Seq(vec![Reply::Raw(tail_is_error), lines(&["OK"])]);
    let (result, took, chat) = dial(&Port::new(script), config());
    assert_eq!(result, Ok(Connected { rate: Some(150_000_000) }));
    assert_eq!(took, ms(0));
    assert_eq!(chat.stats().overlong, 2);
}

#[test]
fn port_returning_zero_bytes_pauses_and_gives_up() {
    let port = Port::new(vec![on("AT", Reply::Close)]);
    let (result, took, chat) = dial(&port, config());
    let err = result.unwrap_err();
    assert_eq!(err, DialError { step: Step::Probe, failure: Failure::Closed });
    assert_eq!(err.class(), Class::ResetModem);
    // Ten reads, a 100 ms pause after each of the first nine.
    assert_eq!(took, ms(900));
    assert_eq!(port.0.borrow().zero_reads, 10);
    assert_eq!(chat.stats().zero_reads, 10);
}

#[test]
fn port_accepting_zero_bytes_pauses_and_gives_up() {
    let port = Port::new(vec![on("AT", Reply::Seq(vec![lines(&["OK"]), Reply::ZeroWrites]))]);
    let (result, took, chat) = dial(&port, config());
    let err = result.unwrap_err();
    assert_eq!(err, DialError { step: Step::EchoOff, failure: Failure::WriteZero });
    assert_eq!(err.class(), Class::ResetModem);
    assert_eq!(took, ms(900));
    assert_eq!(chat.stats().zero_writes, 10);
}

#[test]
fn port_errors_are_typed() {
    let port = Port::new(vec![on("AT", Reply::ReadError(ErrorKind::InvalidData))]);
    let (result, took, _) = dial(&port, config());
    let err = result.unwrap_err();
    assert_eq!(err, DialError { step: Step::Probe, failure: Failure::Read(ErrorKind::InvalidData) });
    assert_eq!(err.class(), Class::RetryLater);
    assert_eq!(took, ms(0));

    let port = Port::new(vec![
        on("AT", lines(&["OK"])),
        on("ATE0", Reply::Seq(vec![lines(&["OK"]), Reply::BreakWrites(ErrorKind::BrokenPipe)])),
    ]);
    let (result, _, _) = dial(&port, config());
    let err = result.unwrap_err();
    assert_eq!(err, DialError { step: Step::DefineContext, failure: Failure::Write(ErrorKind::BrokenPipe) });
    assert_eq!(err.class(), Class::RetryLater);
}

#[test]
fn stalled_write_ends_at_the_deadline() {
    let port = Port::new(vec![on("AT", Reply::Seq(vec![lines(&["OK"]), Reply::StallWrites]))]);
    let (result, took, _) = dial(&port, config());
    let err = result.unwrap_err();
    assert_eq!(err, DialError { step: Step::EchoOff, failure: Failure::WriteStalled });
    assert_eq!(err.class(), Class::ResetModem);
    assert_eq!(took, ms(5000));
}

#[test]
fn delayed_reply_within_the_deadline_is_taken() {
    let mut script = happy(CGDCONT);
    script[3].reply = Reply::After(ms(45_000), Box::new(lines(&["CONNECT 150000000"])));
    script[1].reply = Reply::After(ms(4999), Box::new(lines(&["OK"])));
    let (result, took, _) = dial(&Port::new(script), config());
    assert_eq!(result, Ok(Connected { rate: Some(150_000_000) }));
    assert_eq!(took, ms(49_999));
}

/// Dials, lets PPP run for `session`, then runs `after` on the same chat and port.
/// Returns the dial's result, the hang-up's, its virtual duration and the redial's.
fn session(
    port: &Port,
    config: Config<'static>,
    during_ppp: impl FnOnce(&Port) + 'static,
    next_script: Vec<Exchange>,
) -> (Result<(), DialError>, Duration, Instant, Result<Connected, DialError>, Chat<'static>) {
    let p = port.clone();
    let ((hung, hang_took, hang_start, redial, chat), _) = run(|| async move {
        let mut p = p;
        let mut chat = Chat::new(config);
        chat.dial(&mut p).await.unwrap();
        // PPP runs for a while; the modem's frames keep coming until it leaves data mode.
        Timer::after(Duration::from_secs(30)).await;
        during_ppp(&p);
        p.script(next_script);
        let start = Instant::now();
        let hung = chat.hang_up(&mut p).await;
        let took = Instant::now() - start;
        let redial = chat.dial(&mut p).await;
        (hung, took, start, redial, chat)
    });
    assert!(hang_took <= config.hang_up_bound());
    (hung, hang_took, hang_start, redial, chat)
}

#[test]
fn hang_up_then_redial_after_ppp_ended() {
    let port = Port::new(happy(CGDCONT));
    let mut next = vec![
        // The modem answers the escape after its own 1 s guard.
        on("+++", Reply::After(ms(1000), Box::new(lines(&["OK"])))),
        on("ATH", lines(&["OK"])),
    ];
    next.extend(happy(CGDCONT));
    let (hung, took, start, redial, chat) =
        session(&port, config(), |p| p.push_unsolicited(b"\x7e\xff\x03\x00\x21\x45\x00\x7e"), next);
    assert_eq!(hung, Ok(()));
    assert_eq!(redial, Ok(Connected { rate: Some(150_000_000) }));
    // 1.2 s of silence, +++, 1.2 s of silence, ATH.
    assert_eq!(took, ms(2400));
    let escape = port.command_time("+++");
    let ath = port.command_time("ATH");
    assert_eq!(escape, [start + ms(1200)]);
    assert_eq!(ath, [start + ms(2400)]);
    // Nothing was written in the guard times around +++.
    let writes = port.0.borrow().writes.clone();
    let escape_at = escape[0];
    assert!(
        writes
            .iter()
            .all(|(t, _)| *t <= escape_at - ms(1200) || *t == escape_at || *t >= escape_at + ms(1200))
    );
    assert_eq!(chat.stats().escapes_unanswered, 0);
    // The PPP frame still in flight was dropped as garbage.
    assert_eq!(chat.stats().garbage, 1);
    assert_eq!(port.script_left(), 0);
}

#[test]
fn hang_up_after_no_carrier_then_redial() {
    // The network ended the call: the modem said NO CARRIER and is in command mode, where
    // `+++` is not an escape. The NO CARRIER is still unread when the chat hangs up.
    let port = Port::new(happy(CGDCONT));
    let mut next = vec![on("ATH", lines(&["OK"]))];
    next.extend(happy(CGDCONT));
    let (hung, took, _, redial, chat) =
        session(&port, config(), |p| p.push_unsolicited(b"\r\nNO CARRIER\r\n"), next);
    assert_eq!(hung, Ok(()));
    assert!(redial.is_ok());
    // The escape wait ended at NO CARRIER; ATH still waits out the guard after +++.
    assert_eq!(took, ms(2400));
    assert_eq!(chat.stats().escapes_unanswered, 0);
}

#[test]
fn hang_up_when_ppp_ate_no_carrier_then_redial() {
    // As above, but PPP's reader consumed the NO CARRIER: the escape goes unanswered, and the
    // `+++` left in the modem's line buffer spoils the first ATH.
    let port = Port::new(happy(CGDCONT));
    let mut next = vec![on("ATH", lines(&["ERROR"])), on("ATH", lines(&["OK"]))];
    next.extend(happy(CGDCONT));
    let (hung, took, _, redial, chat) = session(&port, config(), |_| {}, next);
    assert_eq!(hung, Ok(()));
    assert!(redial.is_ok());
    // 1.2 s before, 2.4 s waiting for an answer to +++, then both ATH at once.
    assert_eq!(took, ms(3600));
    assert_eq!(chat.stats().escapes_unanswered, 1);
    let wire: Vec<u8> = port.0.borrow().writes.iter().flat_map(|(_, b)| b.clone()).collect();
    assert!(wire.windows(11).any(|w| w == b"+++ATH\rATH\r"));
}

#[test]
fn hang_up_of_a_silent_modem_is_bounded() {
    let port = Port::new(happy(CGDCONT));
    let next = vec![on("ATH", Reply::Silence), on("ATH", Reply::Silence)];
    let p = port.clone();
    let config = config();
    let ((hung, took), _) = run(|| async move {
        let mut p = p;
        let mut chat = Chat::new(config);
        chat.dial(&mut p).await.unwrap();
        p.script(next);
        let start = Instant::now();
        let hung = chat.hang_up(&mut p).await;
        (hung, Instant::now() - start)
    });
    let err = hung.unwrap_err();
    assert_eq!(err, DialError { step: Step::HangUp, failure: Failure::Silence });
    assert_eq!(err.class(), Class::ResetModem);
    // 1.2 s + 2.4 s escape, two ATH of 5 s.
    assert_eq!(took, ms(13_600));
    assert!(took <= config.hang_up_bound());
}

#[test]
fn dtr_hang_up_pulses_and_confirms() {
    let dtr_config = config().with_hang_up(HangUp::Dtr);
    let mut script = happy(CGDCONT);
    script.insert(2, on("AT&D2", lines(&["OK"])));
    let port = Port::new(script);
    let p = port.clone();
    let ((dialed, hung, start, dtr), _) = run(|| async move {
        let mut p = p;
        let mut chat = Chat::new(dtr_config);
        let dialed = chat.dial(&mut p).await;
        Timer::after(Duration::from_secs(10)).await;
        p.script(vec![on("ATH", Reply::After(ms(300), Box::new(lines(&["NO CARRIER", "OK"]))))]);
        let mut dtr = RecordingDtr::default();
        let start = Instant::now();
        let hung = chat.hang_up_dtr(&mut p, &mut dtr).await;
        (dialed, hung.map(|()| Instant::now() - start), start, dtr)
    });
    assert!(dialed.is_ok());
    assert_eq!(port.commands()[2], "AT&D2");
    // DTR off for 500 ms, ATH at once after, its OK 300 ms later (NO CARRIER before it is noise).
    assert_eq!(hung, Ok(ms(800)));
    assert_eq!(dtr.changes, [(start, false), (start + ms(500), true)]);
    assert_eq!(port.command_time("ATH"), [start + ms(500)]);
    assert!(ms(800) <= dtr_config.hang_up_dtr_bound());
}

#[test]
fn dtr_pin_error_is_typed() {
    let port = Port::new(vec![]);
    let p = port.clone();
    let (hung, took) = run(|| async move {
        let mut p = p;
        let mut chat = Chat::new(config().with_hang_up(HangUp::Dtr));
        let mut dtr = RecordingDtr { fail: true, ..RecordingDtr::default() };
        chat.hang_up_dtr(&mut p, &mut dtr).await
    });
    let err = hung.unwrap_err();
    assert_eq!(err, DialError { step: Step::Dtr, failure: Failure::DtrPin });
    assert_eq!(err.class(), Class::ResetModem);
    assert_eq!(took, ms(0));
    assert!(port.0.borrow().writes.is_empty());
}

#![allow(clippy::unwrap_used)]

use super::*;

/// Feeds `bytes` through a line buffer into an exchange, as the device does.
fn exchange(bytes: &[u8]) -> (Option<Result<Answer, ProtoError>>, u32) {
    let mut lines = LineBuf::<MAX_LINE>::new();
    let mut ex = PostExchange::new();
    for &b in bytes {
        let got = match lines.push(b) {
            Event::Pending => None,
            Event::Line => ex.feed(parse_line(lines.line())),
            Event::Overflow => ex.feed(Err(LineError::Overflow)),
        };
        if got.is_some() {
            return (got, ex.noise());
        }
    }
    (None, ex.noise())
}

fn field(s: &str) -> Option<Field> {
    Some(Field::from_slice(s.as_bytes()).unwrap())
}

#[test]
fn a_status_with_retry_after_and_date() {
    let reply = post_reply(503, Some("1"), Some("Sun, 06 Nov 1994 08:49:37 GMT")).unwrap();
    let (got, noise) = exchange(reply.as_bytes());
    let answer = got.unwrap().unwrap();
    assert_eq!(
        answer,
        Answer::Status { status: 503, retry_after: field("1"), date: field("Sun, 06 Nov 1994 08:49:37 GMT") }
    );
    assert_eq!(noise, 0);
    assert_eq!(answer.outcome(&Rules::LENIENT), Outcome::status_after(503, 1));
}

#[test]
fn a_2xx_is_ok_and_empty_fields_are_none() {
    let (got, _) = exchange(post_reply(201, None, None).unwrap().as_bytes());
    let answer = got.unwrap().unwrap();
    assert_eq!(answer, Answer::Status { status: 201, retry_after: None, date: None });
    assert_eq!(answer.outcome(&Rules::LENIENT), Outcome::Ok);
}

#[test]
fn a_retry_after_date_is_measured_against_the_date_header() {
    let reply = post_reply(429, Some("Sun, 06 Nov 1994 08:49:42 GMT"), Some("Sun, 06 Nov 1994 08:49:37 GMT"))
        .unwrap();
    let answer = exchange(reply.as_bytes()).0.unwrap().unwrap();
    assert_eq!(answer.outcome(&Rules::LENIENT), Outcome::status_after(429, 5));
    // The strict rules refuse dates: the status stays, the wait is the policy's own.
    assert_eq!(answer.outcome(&Rules::STRICT), Outcome::status(429));
}

#[test]
fn link_errors_map_to_their_outcomes() {
    for (e, o) in [
        (LinkError::Timeout, Outcome::ResponseTimeout),
        (LinkError::Connect, Outcome::ConnectTimeout),
        (LinkError::Refused, Outcome::Refused),
        (LinkError::Reset, Outcome::Reset),
        (LinkError::BadBody, Outcome::BadBody),
    ] {
        let answer = exchange(err_reply(e).as_bytes()).0.unwrap().unwrap();
        assert_eq!(answer, Answer::Link(e));
        assert_eq!(answer.outcome(&Rules::LENIENT), o);
    }
}

#[test]
fn garbage_and_oversized_lines_are_noise() {
    let mut bytes = std::vec::Vec::new();
    bytes.extend_from_slice(b"\r\n\xfe\x01junk\x7f\r\n");
    bytes.extend_from_slice(b"RING\r\n");
    bytes.extend_from_slice(&[b'x'; 300]);
    bytes.extend_from_slice(b"\r\n+SEED: 5\r\n");
    bytes.extend_from_slice(post_reply(200, None, None).unwrap().as_bytes());
    let (got, noise) = exchange(&bytes);
    assert_eq!(got.unwrap().unwrap().outcome(&Rules::LENIENT), Outcome::Ok);
    assert_eq!(noise, 4);
}

#[test]
fn a_truncated_answer_never_completes() {
    let reply = post_reply(201, None, None).unwrap();
    for cut in 0..reply.len() - 1 {
        let (got, _) = exchange(reply.as_bytes().get(..cut).unwrap());
        assert_eq!(got, None, "cut at {cut}");
    }
    assert_eq!(ProtoError::Timeout.outcome(), Outcome::ResponseTimeout);
}

#[test]
fn a_lost_info_line_or_a_malformed_one_is_maybe_sent() {
    let (got, noise) = exchange(b"\r\n+HTTPPO\xffST: 201\r\n\r\nOK\r\n");
    assert_eq!(got.unwrap(), Err(ProtoError::NoInfo));
    assert_eq!(noise, 1);
    let (got, _) = exchange(b"\r\n+HTTPPOST: 2x1,\"\",\"\"\r\n\r\nOK\r\n");
    assert_eq!(got.unwrap(), Err(ProtoError::Malformed));
    assert_eq!(ProtoError::Malformed.outcome(), Outcome::Reset);
    assert_eq!(exchange(b"\r\nERROR\r\n").0.unwrap(), Err(ProtoError::Rejected));
    assert_eq!(ProtoError::Rejected.outcome(), Outcome::Refused);
}

/// Only an `ERROR` with nothing else since the command means "never sent". After a status line,
/// or after noise that may have been a garbled `+HTTPERR: TIMEOUT`, the write may have landed,
/// so an unkeyed write is not resent.
#[test]
fn error_after_a_status_or_noise_may_have_landed() {
    let (got, _) = exchange(b"\r\n+HTTPPOST: 201,\"\",\"\"\r\n\r\nERROR\r\n");
    assert_eq!(got.unwrap(), Err(ProtoError::Malformed));
    let (got, noise) = exchange(b"\r\n+HTTPE\xffR: TIMEOUT\r\n\r\nERROR\r\n");
    assert_eq!((got.unwrap(), noise), (Err(ProtoError::NoInfo), 1));
    for e in [ProtoError::Malformed, ProtoError::NoInfo] {
        let write = wary::Table::DEFAULT.classify(wary::Operation::Write, &e.outcome());
        assert_eq!(write, wary::Class::Unknown, "{e:?}");
    }
}

#[test]
fn malformed_post_lines() {
    for line in [
        &b"+HTTPPOST: "[..],
        b"+HTTPPOST: 201",
        b"+HTTPPOST: 201,\"\"",
        b"+HTTPPOST: 201,\"\",\"\",",
        b"+HTTPPOST: 99,\"\",\"\"",
        b"+HTTPPOST: 1000,\"\",\"\"",
        b"+HTTPPOST: 99999999999999999999999,\"\",\"\"",
        b"+HTTPPOST: -1,\"\",\"\"",
        b"+HTTPPOST: 201,\"unterminated,\"\"",
        b"+HTTPERR: MAYBE",
        b"+SEED: ",
        b"+SEED: 18446744073709551616",
    ] {
        assert_eq!(parse_line(line), Err(LineError::Malformed), "{}", core::str::from_utf8(line).unwrap());
    }
    let long = [b'1'; MAX_FIELD + 1];
    let mut line = std::vec::Vec::from(&b"+HTTPPOST: 503,\""[..]);
    line.extend_from_slice(&long);
    line.extend_from_slice(b"\",\"\"");
    assert_eq!(parse_line(&line), Err(LineError::Malformed));
}

#[test]
fn seed_lines() {
    assert_eq!(parse_line(b"+SEED: 18446744073709551615"), Ok(Line::Seed(u64::MAX)));
    let reply = seed_reply(42);
    let mut lines = LineBuf::<MAX_LINE>::new();
    let mut seen = std::vec::Vec::new();
    for &b in reply.as_bytes() {
        if lines.push(b) == Event::Line {
            seen.push(match parse_line(lines.line()).unwrap() {
                Line::Seed(n) => n,
                Line::Ok => u64::MAX,
                _ => 0,
            });
        }
    }
    assert_eq!(seen, [42, u64::MAX]);
}

#[test]
fn commands_round_trip() {
    let key = "0123456789abcdef0123456789abcdef";
    let cmd = post_command("/readings", key, 27).unwrap();
    assert!(cmd.ends_with('\r'));
    let line = cmd.trim_end_matches('\r').as_bytes();
    assert_eq!(parse_command(line), Ok(Command::Post { path: "/readings", key, len: 27 }));
    assert_eq!(parse_command(&SEED_QUERY[..SEED_QUERY.len() - 1]), Ok(Command::Seed));
    assert_eq!(parse_command(b"AT"), Ok(Command::At));
    assert_eq!(parse_command(b"ATD123"), Err(LineError::Garbage));
    assert_eq!(parse_command(b"AT+HTTPPOST=\"/r\",\"k\",513"), Err(LineError::Malformed));
    assert_eq!(parse_command(b"AT+HTTPPOST=\"r\",\"k\",1"), Err(LineError::Malformed));
    assert_eq!(parse_command(b"AT+HTTPPOST=\"/r\",\"\",1"), Err(LineError::Malformed));
    assert_eq!(parse_command(b"AT+HTTPPOST=\"/r\",\"k\""), Err(LineError::Malformed));
    assert_eq!(parse_command(b"AT\x00"), Err(LineError::Garbage));
}

#[test]
fn replies_leave_out_values_that_would_break_the_line() {
    let r = post_reply(429, Some("1\"2"), Some(&"x".repeat(MAX_FIELD + 1))).unwrap();
    assert_eq!(r.as_str(), "\r\n+HTTPPOST: 429,\"\",\"\"\r\n\r\nOK\r\n");
}

#[test]
fn line_buffer_bounds_and_recovers() {
    let mut lines = LineBuf::<8>::new();
    for &b in b"123456789" {
        assert_eq!(lines.push(b), Event::Pending);
    }
    assert_eq!(lines.push(b'\n'), Event::Overflow);
    for &b in b"12345678" {
        lines.push(b);
    }
    assert_eq!(lines.push(b'\r'), Event::Line);
    assert_eq!(lines.line(), b"12345678");
    assert_eq!(lines.push(b'\n'), Event::Pending, "the \\n of \\r\\n is an empty line, skipped");
    lines.push(b'a');
    assert_eq!(lines.partial(), 1);
    lines.clear();
    assert_eq!(lines.partial(), 0);
}

/// Random bytes never panic and never complete an exchange without a final line.
#[test]
fn random_bytes_are_classified_without_panicking() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let alphabet = b"+HTTPOSERDK: ,\"0123456789\r\n\xff";
    for _ in 0..2000 {
        let len = (next() % 200) as usize;
        let bytes: std::vec::Vec<u8> = (0..len)
            .map(|_| {
                let r = next();
                if r % 4 == 0 { r as u8 } else { alphabet[(r as usize / 4) % alphabet.len()] }
            })
            .collect();
        let _ = exchange(&bytes);
        let _ = parse_command(&bytes);
    }
}

/// Duplicate Retry-After headers reach the device joined with `|`: lenient rules take the
/// longest, strict rules refuse them (seed 003), so no wait is taken from either.
#[test]
fn duplicate_retry_after_values_reach_the_rules() {
    let answer =
        Answer::Status { status: 429, retry_after: Some(Field::from_slice(b"1|3600").unwrap()), date: None };
    assert_eq!(answer.outcome(&Rules::LENIENT), Outcome::status_after(429, 3600));
    assert_eq!(answer.outcome(&Rules::STRICT), Outcome::status(429));
    let one = Answer::Status { status: 503, retry_after: Some(Field::from_slice(b"2").unwrap()), date: None };
    assert_eq!(one.outcome(&Rules::STRICT), Outcome::status_after(503, 2));
}

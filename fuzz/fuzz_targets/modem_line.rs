//! Arbitrary bytes from the modem's UART: assembled into bounded lines, classified, and fed to a
//! POST exchange. Never a panic; every line is classified; an exchange that ends maps to an
//! outcome; a status line that parses re-encodes to a line with the same status.

#![no_main]

use libfuzzer_sys::fuzz_target;
use wary::retry_after::Rules;
use wary_modem_proto::{Event, Line, LineBuf, MAX_LINE, PostExchange, parse_line, post_reply};

fuzz_target!(|data: &[u8]| {
    let mut buf = LineBuf::<MAX_LINE>::new();
    let mut exchange = PostExchange::new();
    for &b in data {
        match buf.push(b) {
            Event::Pending => {}
            Event::Overflow => {
                assert!(buf.line().is_empty(), "an overflowed line is never kept in part");
            }
            Event::Line => {
                let line = buf.line();
                assert!(!line.is_empty() && line.len() <= MAX_LINE);
                let parsed = parse_line(line);
                if let Ok(Line::Post(p)) = parsed {
                    let ra = p.retry_after.and_then(|v| core::str::from_utf8(v).ok());
                    let date = p.date.and_then(|v| core::str::from_utf8(v).ok());
                    if let Ok(again) = post_reply(p.status, ra, date) {
                        let line = again.split("\r\n").find(|l| l.starts_with("+HTTPPOST")).unwrap_or("");
                        let back = parse_line(line.as_bytes());
                        assert!(
                            matches!(back, Ok(Line::Post(q)) if q.status == p.status),
                            "a status line re-encodes to the same status"
                        );
                    }
                }
                if let Some(answer) = exchange.feed(parsed) {
                    let _ = match answer {
                        Ok(a) => a.outcome(&Rules::LENIENT),
                        Err(e) => e.outcome(),
                    };
                    exchange = PostExchange::new();
                }
            }
        }
    }
});

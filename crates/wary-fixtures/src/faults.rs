//! The network-fault server: a plain HTTP/1.1 server on 127.0.0.1 that answers each request
//! as [`SCRIPT`] says for its path (a reply, a reset, a stall, a trickle, ...), and records
//! what each request looked like. The firmware's `nettest` makes one exchange per scripted
//! fault and checks how the device classified it; [`check_served`] checks that every request
//! was well-formed HTTP/1.1 and that each fault was served exactly once.

use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use crate::request::{Expect, Served, read_body, read_head};
use crate::server::{HANDLER_LIFETIME, Server, linger_until_closed};

/// Header block of `/huge-headers`: four times the device's 1 KiB buffer.
const HUGE_HEADERS: usize = 4 * 1024;

/// What the fixture does with a connection, picked by the request's path.
#[derive(Clone, Copy, Debug)]
pub enum Reply {
    /// Writes these bytes, then closes (FIN).
    Bytes(&'static [u8]),
    /// A status line and [`HUGE_HEADERS`] bytes of headers.
    HugeHeaders,
    /// Closes with a reset (SO_LINGER 0) right after reading the request.
    Reset,
    /// Closes with a reset after reading only the head: the device is still sending its body.
    ResetEarly,
    /// Closes cleanly without a byte of reply.
    Close,
    /// Holds the connection open and says nothing.
    Stall,
    /// Starts a reply, then sends one header byte every 100 ms, never ending the block.
    Trickle,
}

/// The script, by path. Must agree with `CASES` in the firmware's `nettest` binary (paths and header values).
pub const SCRIPT: &[(&str, Reply)] = &[
    (
        "/ok",
        Reply::Bytes(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\
              Connection: close\r\n\r\n{\"id\":1234}",
        ),
    ),
    ("/unavailable", Reply::Bytes(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")),
    (
        "/throttled-seconds",
        Reply::Bytes(b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 2\r\nContent-Length: 0\r\n\r\n"),
    ),
    (
        "/throttled-date",
        Reply::Bytes(
            b"HTTP/1.1 429 Too Many Requests\r\nDate: Wed, 21 Oct 2026 07:27:30 GMT\r\n\
              Retry-After: Wed, 21 Oct 2026 07:28:00 GMT\r\nContent-Length: 0\r\n\r\n",
        ),
    ),
    (
        "/odd-case",
        Reply::Bytes(
            b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 3\r\nRETRY-AFTER: 4\r\n\
              dATE: Wed, 21 Oct 2026 07:27:30 GMT\r\ncontent-length: 0\r\n\r\n",
        ),
    ),
    (
        "/many-retry-after",
        Reply::Bytes(
            b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\n\
              Retry-After: 99999999999999999999999999999999999999999999999999999999999999999999999999999999\r\n\
              Retry-After: 2\r\nRetry-After: 3\r\nRetry-After: 4\r\nRetry-After: 5\r\n\
              Date: Wednesday, 21-Oct-2026 07:27:30 GMT plus some more text\r\n\
              Content-Length: 0\r\n\r\n",
        ),
    ),
    (
        "/body-cut",
        Reply::Bytes(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\":12"),
    ),
    ("/reset", Reply::Reset),
    ("/reset-early", Reply::ResetEarly),
    ("/closed", Reply::Close),
    ("/stall", Reply::Stall),
    ("/trickle", Reply::Trickle),
    ("/truncated", Reply::Bytes(b"HTTP/1.1 200 OK\r\nContent-Type: applic")),
    ("/garbage", Reply::Bytes(b"\x00\x01\x02 this is not HTTP\r\n\r\n")),
    ("/huge-headers", Reply::HugeHeaders),
];

/// Every scripted path served exactly once, nothing else served, every request well-formed,
/// every key distinct; the summary line to print.
pub fn check_served(served: &[Served]) -> Result<String> {
    let mut errors = vec![];
    for (path, _) in SCRIPT {
        let n = served.iter().filter(|s| s.path == *path).count();
        if n != 1 {
            errors.push(format!("{path} served {n} times, expected once"));
        }
    }
    for s in served {
        if !SCRIPT.iter().any(|(path, _)| *path == s.path) {
            errors.push(format!("unexpected request for {:?}", s.path));
        }
        for problem in &s.problems {
            errors.push(format!("{}: {problem}", s.path));
        }
    }
    let mut keys: Vec<&str> = served.iter().map(|s| s.key.as_str()).collect();
    keys.sort_unstable();
    keys.dedup();
    if keys.len() != served.len() {
        errors.push("two requests carried the same Idempotency-Key".into());
    }
    if !errors.is_empty() {
        bail!("fixture: {}", errors.join("; "));
    }
    Ok(format!(
        "{} requests, each scripted fault served once, every request well-formed HTTP/1.1",
        served.len()
    ))
}

/// Starts the scripted server on a free port of 127.0.0.1.
pub fn start() -> Result<Server<Served>> {
    // The handlers check the Host header against the port, known once bound; no request can
    // arrive before the caller learns it.
    let port = Arc::new(OnceLock::new());
    let known = Arc::clone(&port);
    let server = Server::start(move |stream, done: &AtomicBool| {
        serve(stream, known.get().copied().unwrap_or(0), done)
    })?;
    let _ = port.set(server.port);
    Ok(server)
}

/// Reads one request, checks it, and answers as the script says for its path.
fn serve(mut stream: TcpStream, port: u16, done: &AtomicBool) -> Served {
    let mut served = Served { path: String::new(), key: String::new(), problems: vec![] };
    let mut request = match read_head(&mut stream) {
        Ok(request) => request,
        Err(err) => {
            served.problems.push(format!("unreadable request head: {err:#}"));
            return served;
        }
    };
    served.path.clone_from(&request.path);
    served.key = request.key();
    let reply = SCRIPT.iter().find(|(path, _)| *path == request.path).map(|(_, reply)| *reply);
    let whole = !matches!(reply, Some(Reply::ResetEarly));
    if whole && let Err(err) = read_body(&mut stream, &mut request) {
        served.problems.push(format!("unreadable request body: {err:#}"));
        return served;
    }
    let host = format!("10.0.2.2:{port}");
    served.problems = request.problems(Expect { path: None, host: &host }, whole);
    let Some(reply) = reply else {
        let _ = stream.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
        return served;
    };
    // Errors writing are expected where the device gives up first (huge headers, trickle).
    match reply {
        Reply::Bytes(bytes) => {
            let _ = stream.write_all(bytes);
            let _ = stream.shutdown(Shutdown::Write);
            linger(&mut stream, done);
        }
        Reply::HugeHeaders => {
            let mut block = b"HTTP/1.1 200 OK\r\n".to_vec();
            let mut n = 0;
            while block.len() < HUGE_HEADERS {
                block.extend_from_slice(format!("X-Filler-{n}: {}\r\n", "f".repeat(60)).as_bytes());
                n += 1;
            }
            block.extend_from_slice(b"Content-Length: 0\r\n\r\n");
            let _ = stream.write_all(&block);
            linger(&mut stream, done);
        }
        Reply::Reset | Reply::ResetEarly => {
            if let Err(err) = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO)) {
                served.problems.push(format!("fixture could not set SO_LINGER 0: {err}"));
            }
        }
        Reply::Close => {
            let _ = stream.shutdown(Shutdown::Write);
            linger(&mut stream, done);
        }
        Reply::Stall => linger(&mut stream, done),
        Reply::Trickle => {
            let started = Instant::now();
            let mut ok = stream.write_all(b"HTTP/1.1 200 OK\r\nX-Slow: ").is_ok();
            while ok && !done.load(Ordering::SeqCst) && started.elapsed() < HANDLER_LIFETIME {
                thread::sleep(Duration::from_millis(100));
                ok = stream.write_all(b"a").is_ok();
            }
        }
    }
    served
}

/// [`linger_until_closed`], polling the run's end every 50 ms.
fn linger(stream: &mut TcpStream, done: &AtomicBool) {
    let _ = stream.set_read_timeout(Some(Duration::from_millis(50)));
    linger_until_closed(stream, done);
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn served(path: &str, key: &str) -> Served {
        Served { path: path.into(), key: key.into(), problems: vec![] }
    }

    fn all_scripted() -> Vec<Served> {
        SCRIPT.iter().enumerate().map(|(i, (path, _))| served(path, &format!("{i:032x}"))).collect()
    }

    #[test]
    fn a_full_clean_run_passes() {
        assert!(check_served(&all_scripted()).is_ok());
    }

    #[test]
    fn a_missing_a_repeated_or_an_unexpected_path_fails() {
        let mut missing = all_scripted();
        missing.pop();
        assert!(check_served(&missing).is_err());
        let mut repeated = all_scripted();
        repeated.push(served("/ok", "ffffffffffffffffffffffffffffffff"));
        assert!(check_served(&repeated).is_err());
        let mut unexpected = all_scripted();
        unexpected.push(served("/refused", "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee"));
        assert!(check_served(&unexpected).is_err());
    }

    #[test]
    fn a_malformed_request_or_a_reused_key_fails() {
        let mut bad = all_scripted();
        bad[0].problems.push("Content-Type None".into());
        assert!(check_served(&bad).is_err());
        let mut reused = all_scripted();
        reused[1].key = reused[0].key.clone();
        assert!(check_served(&reused).is_err());
    }

    /// The fixture against a hand-written request over a real socket: a good one passes,
    /// each missing piece is named.
    #[test]
    fn the_fixture_checks_the_wire_format() {
        let fixture = start().unwrap();
        let body = br#"{"seq":1,"mC":21000}"#;
        let good = format!(
            "POST /unavailable HTTP/1.1\r\nHost: 10.0.2.2:{}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nIdempotency-Key: 0a386001000000000000000000000001\r\n\
             Connection: close\r\n\r\n",
            fixture.port,
            body.len()
        );
        let mut stream = TcpStream::connect(("127.0.0.1", fixture.port)).unwrap();
        stream.write_all(good.as_bytes()).unwrap();
        stream.write_all(body).unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).unwrap();
        assert!(reply.starts_with("HTTP/1.1 503 "), "{reply}");
        drop(stream);

        let mut stream = TcpStream::connect(("127.0.0.1", fixture.port)).unwrap();
        stream.write_all(b"GET /ok HTTP/1.0\r\nConnection: upgrade\r\nContent-Length: 0\r\n\r\n").unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).unwrap();
        drop(stream);

        let served = fixture.stop();
        assert_eq!(served.len(), 2);
        let good = served.iter().find(|s| s.path == "/unavailable").unwrap();
        assert!(good.problems.is_empty(), "{:?}", good.problems);
        let bad = served.iter().find(|s| s.path == "/ok").unwrap();
        let text = bad.problems.join("; ");
        for what in ["method", "version", "Host", "Content-Type", "Connection", "Idempotency-Key", "JSON"] {
            assert!(text.contains(what), "{what} not named in {text}");
        }
    }
}

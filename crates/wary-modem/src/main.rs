//! `wary-modem`: the modem of wary's device uplink, emulated on the host.
//!
//! It connects to the Unix socket QEMU serves for the guest's UART
//! (`-chardev socket,id=modem,path=<sock>,server=on,wait=on -serial chardev:modem`), answers the
//! AT protocol of `wary-modem-proto`, and performs **each `AT+HTTPPOST` as exactly one real
//! HTTP/1.1 request** to the test cloud, passing back the status, `Retry-After` and `Date`
//! unchanged: the modem never retries. The cloud runs in-process with a fault script
//! (`--faults`), or is an external one (`--cloud http://127.0.0.1:PORT`). On its own side the
//! modem can put garbage or oversized lines before an answer (`--garbage`) and cut an answer
//! short after the request was made (`--truncate`).
//!
//! When the guest goes away (QEMU exits and the socket closes), it prints one JSON object on
//! stdout: its own counters, the cloud's stats and, with the in-process cloud, each key's.

use std::collections::BTreeMap;
use std::io::{self, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde_json::json;
use wary_cloud::{Cloud, Faults};
use wary_modem_proto::{
    Command, Event, LineBuf, LinkError, MAX_LINE, err_reply, parse_command, post_reply, seed_reply,
};

/// The modem emulator.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// QEMU's UART chardev socket.
    #[arg(long)]
    socket: PathBuf,
    /// Fault script of the in-process cloud (compact form, e.g. `503=0.2,429=0.1:ra=1,seed=7`).
    #[arg(long, default_value = "")]
    faults: String,
    /// Use this cloud instead of an in-process one (`http://127.0.0.1:PORT`).
    #[arg(long)]
    cloud: Option<String>,
    /// Share of answers preceded by a garbage or oversized line.
    #[arg(long, default_value_t = 0.0)]
    garbage: f64,
    /// Share of answers cut short after the HTTP request was made.
    #[arg(long, default_value_t = 0.0)]
    truncate: f64,
    /// Seed of the modem's own faults and of the jitter seed handed to the device
    /// (`AT+SEED?`); from the clock when absent.
    #[arg(long)]
    seed: Option<u64>,
    /// How long to wait for QEMU's socket to appear, in seconds.
    #[arg(long, default_value_t = 30)]
    wait_socket: u64,
    /// The modem's HTTP timeout, in milliseconds.
    #[arg(long, default_value_t = 1500)]
    http_timeout_ms: u64,
}

/// SplitMix64: small and good enough to choose faults.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// True with probability `p`.
    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

#[derive(Default, Debug)]
struct Counters {
    commands: u64,
    posts: u64,
    http_status: BTreeMap<String, u64>,
    garbage_lines: u64,
    oversized_lines: u64,
    truncated: u64,
    bad_commands: u64,
    keys: Vec<String>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let seed = args.seed.unwrap_or_else(|| {
        SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
    });
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let (cloud, addr) = match &args.cloud {
        Some(url) => (None, parse_url(url)?),
        None => {
            let faults: Faults = if args.faults.is_empty() {
                Faults::default()
            } else {
                Faults::parse_any(&args.faults).map_err(anyhow::Error::msg).context("--faults")?
            };
            let cloud = runtime.block_on(Cloud::start("127.0.0.1:0", faults))?;
            let addr = cloud.addr();
            (Some(cloud), addr)
        }
    };
    eprintln!("wary-modem: cloud http://{addr}, seed {seed}, socket {}", args.socket.display());

    let stream = connect(&args.socket, Duration::from_secs(args.wait_socket))?;
    let mut counters = Counters::default();
    let mut modem = Modem {
        rx: BufReader::new(stream.try_clone()?),
        tx: stream,
        addr,
        rng: SplitMix(seed),
        seed,
        args: &args,
        counters: &mut counters,
    };
    let served = modem.serve();

    let cloud_stats = match &cloud {
        Some(c) => serde_json::to_value(c.stats())?,
        None => serde_json::from_str(&http_get(addr, "/stats")?).unwrap_or(serde_json::Value::Null),
    };
    let keys: BTreeMap<&str, serde_json::Value> = match &cloud {
        Some(c) => counters
            .keys
            .iter()
            .map(|k| (k.as_str(), serde_json::to_value(c.key_stats(k)).unwrap_or_default()))
            .collect(),
        None => BTreeMap::new(),
    };
    let report = json!({
        "modem": {
            "seed": seed,
            "commands": counters.commands,
            "posts": counters.posts,
            "http_status": counters.http_status,
            "garbage_lines": counters.garbage_lines,
            "oversized_lines": counters.oversized_lines,
            "truncated": counters.truncated,
            "bad_commands": counters.bad_commands,
        },
        "cloud": cloud_stats,
        "keys": keys,
    });
    println!("{report}");
    if let Some(c) = cloud {
        runtime.block_on(c.shutdown());
    }
    served
}

fn parse_url(url: &str) -> Result<SocketAddr> {
    let rest = url.strip_prefix("http://").context("--cloud must be http://HOST:PORT")?;
    let host = rest.split('/').next().unwrap_or(rest);
    host.parse().with_context(|| format!("--cloud {url}: need an IP address and port"))
}

/// Connects to QEMU's socket, waiting for QEMU to create it.
fn connect(path: &PathBuf, limit: Duration) -> Result<UnixStream> {
    let deadline = Instant::now() + limit;
    loop {
        match UnixStream::connect(path) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() < deadline => {
                if !matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ConnectionRefused) {
                    eprintln!("wary-modem: connecting {}: {e}", path.display());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(e).with_context(|| format!("connecting to {}", path.display())),
        }
    }
}

struct Modem<'a> {
    rx: BufReader<UnixStream>,
    tx: UnixStream,
    addr: SocketAddr,
    rng: SplitMix,
    seed: u64,
    args: &'a Args,
    counters: &'a mut Counters,
}

impl Modem<'_> {
    /// Serves commands until the guest closes the socket.
    fn serve(&mut self) -> Result<()> {
        let mut lines = LineBuf::<MAX_LINE>::new();
        let mut byte = [0u8; 1];
        loop {
            match self.rx.read(&mut byte) {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return Ok(()),
                Err(e) => return Err(e).context("reading the UART socket"),
            }
            match lines.push(byte[0]) {
                Event::Pending => {}
                Event::Overflow => {
                    self.counters.bad_commands += 1;
                    self.send(b"\r\nERROR\r\n")?;
                }
                Event::Line => {
                    let line = lines.line().to_vec();
                    self.command(&line)?;
                }
            }
        }
    }

    fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.tx.write_all(bytes)?;
        self.tx.flush()
    }

    fn command(&mut self, line: &[u8]) -> Result<()> {
        self.counters.commands += 1;
        match parse_command(line) {
            Ok(Command::At) => self.send(b"\r\nOK\r\n")?,
            Ok(Command::Seed) => self.send(seed_reply(self.seed).as_bytes())?,
            Ok(Command::Post { path, key, len }) => {
                let mut payload = vec![0u8; len];
                self.rx.read_exact(&mut payload).context("reading the payload")?;
                let (path, key) = (path.to_owned(), key.to_owned());
                self.post(&path, &key, &payload)?;
            }
            Err(_) => {
                self.counters.bad_commands += 1;
                self.send(b"\r\nERROR\r\n")?;
            }
        }
        Ok(())
    }

    /// One command, one HTTP request; then the answer, possibly garbled on the serial line.
    fn post(&mut self, path: &str, key: &str, payload: &[u8]) -> Result<()> {
        self.counters.posts += 1;
        if !self.counters.keys.iter().any(|k| k == key) {
            self.counters.keys.push(key.to_owned());
        }
        let timeout = Duration::from_millis(self.args.http_timeout_ms);
        let reply = match http_post(self.addr, path, key, payload, timeout) {
            Ok(resp) => {
                *self.counters.http_status.entry(resp.status.to_string()).or_default() += 1;
                let bad_body = (200..300).contains(&resp.status) && !resp.json;
                if bad_body {
                    err_reply(LinkError::BadBody)
                } else {
                    post_reply(resp.status, resp.retry_after.as_deref(), resp.date.as_deref())
                        .map_err(|_| anyhow::anyhow!("reply too long"))?
                }
            }
            Err(e) => {
                *self.counters.http_status.entry(e.word().to_lowercase()).or_default() += 1;
                err_reply(e)
            }
        };
        if self.rng.chance(self.args.garbage) {
            self.garbage()?;
        }
        if self.rng.chance(self.args.truncate) {
            self.counters.truncated += 1;
            // Cut inside the information line: the device sees no final line and times out.
            let cut = 3 + (self.rng.next() % 10) as usize;
            let bytes = reply.as_bytes();
            self.send(bytes.get(..cut.min(bytes.len())).unwrap_or(bytes))?;
            return Ok(());
        }
        self.send(reply.as_bytes())?;
        Ok(())
    }

    /// A line of noise: random non-terminator bytes, or a line longer than any buffer.
    fn garbage(&mut self) -> Result<()> {
        let mut line = b"\r\n".to_vec();
        if self.rng.next() % 4 == 0 {
            self.counters.oversized_lines += 1;
            line.extend(std::iter::repeat_n(b'#', 3 * MAX_LINE));
        } else {
            self.counters.garbage_lines += 1;
            let len = 1 + self.rng.next() % 40;
            for _ in 0..len {
                let b = (self.rng.next() & 0xff) as u8;
                line.push(if b == b'\r' || b == b'\n' { b'?' } else { b });
            }
        }
        line.extend_from_slice(b"\r\n");
        self.send(&line)?;
        Ok(())
    }
}

/// What the modem keeps of an HTTP response.
#[derive(Debug, PartialEq, Eq)]
struct HttpResponse {
    status: u16,
    retry_after: Option<String>,
    date: Option<String>,
    /// Content type is JSON and the body looks like a JSON object.
    json: bool,
}

/// One HTTP/1.1 request on a fresh connection (`Connection: close`).
fn http_post(
    addr: SocketAddr,
    path: &str,
    key: &str,
    payload: &[u8],
    timeout: Duration,
) -> Result<HttpResponse, LinkError> {
    let mut stream = match TcpStream::connect_timeout(&addr, timeout) {
        Ok(s) => s,
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => return Err(LinkError::Refused),
        Err(_) => return Err(LinkError::Connect),
    };
    let _ = stream.set_read_timeout(Some(timeout));
    let _ = stream.set_write_timeout(Some(timeout));
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nIdempotency-Key: {key}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        payload.len()
    );
    if stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(payload)).is_err() {
        return Err(LinkError::Reset);
    }
    let mut raw = Vec::new();
    match stream.read_to_end(&mut raw) {
        Ok(_) => {}
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            return Err(LinkError::Timeout);
        }
        Err(_) if raw.is_empty() => return Err(LinkError::Reset),
        Err(_) => {}
    }
    parse_response(&raw).ok_or(LinkError::Reset)
}

fn parse_response(raw: &[u8]) -> Option<HttpResponse> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let mut resp = HttpResponse { status, retry_after: None, date: None, json: false };
    let mut json_type = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else { continue };
        let value = value.trim();
        match name.to_ascii_lowercase().as_str() {
            // Several Retry-After headers travel joined with `|`, which neither form can hold, so
            // the device's rules see the duplicates (strict rules refuse them).
            "retry-after" => match &mut resp.retry_after {
                Some(v) => {
                    v.push('|');
                    v.push_str(value);
                }
                None => resp.retry_after = Some(value.to_owned()),
            },
            "date" => resp.date = Some(value.to_owned()),
            "content-type" => json_type = value.starts_with("application/json"),
            _ => {}
        }
    }
    resp.json = json_type && body.trim_start().starts_with('{');
    Some(resp)
}

fn http_get(addr: SocketAddr, path: &str) -> Result<String> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw)?;
    match raw.split_once("\r\n\r\n") {
        Some((_, body)) => Ok(body.to_owned()),
        None => bail!("no HTTP response from {addr}{path}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_status_retry_after_date_and_body_kind() {
        let raw = b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nretry-after: 1\r\n\
                    retry-after: 3600\r\ndate: Sun, 06 Nov 1994 08:49:37 GMT\r\n\r\n{\"error\":\"slow down\"}";
        let resp = parse_response(raw).unwrap();
        assert_eq!(resp.status, 429);
        assert_eq!(resp.retry_after.as_deref(), Some("1|3600"), "both headers, joined for the device");
        assert_eq!(resp.date.as_deref(), Some("Sun, 06 Nov 1994 08:49:37 GMT"));
        assert!(resp.json);
        let html = b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\n\r\n{\"id\":0}";
        assert!(!parse_response(html).unwrap().json);
        assert_eq!(parse_response(b"HTTP/1.1 20"), None);
    }

    #[test]
    fn chance_is_roughly_right() {
        let mut rng = SplitMix(7);
        let hits = (0..10_000).filter(|_| rng.chance(0.2)).count();
        assert!((1700..2300).contains(&hits), "{hits}");
        assert!(!(0..100).any(|_| rng.chance(0.0)));
    }
}

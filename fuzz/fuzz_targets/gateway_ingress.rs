//! Arbitrary bytes into the gateway's device side, as they arrive on a connection: its HTTP/1.1
//! connection (`wary_gateway::h1`: heads, framing, chunked bodies, pipelining), the credential
//! check, the key check, the body limits. One device is admitted with a token the fuzzer is
//! handed when the first byte asks for it (so the paths past the credential are reached too);
//! whatever the bytes, every answer is one well-formed HTTP response whose status is one the
//! gateway documents, and a request without that device's token never reaches the upstream. The credentials file reader and the bearer check get the
//! same bytes on their own.

#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wary_gateway::credentials::{Credentials, Identity, digest};
use wary_gateway::{Auth, Config, Gateway};

/// The admitted device and its token (a fixed test token: this gateway reaches nothing).
const DEVICE: u64 = 0x0123_4567_89ab_cdef;
const TOKEN: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
const STATUSES: [&str; 15] =
    ["100", "200", "201", "400", "401", "403", "404", "405", "408", "413", "424", "429", "431", "501", "503"];

struct World {
    rt: tokio::runtime::Runtime,
    gw: Arc<Gateway>,
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        // Port 9 on loopback refuses at once; one attempt, so a reading that gets through is
        // answered quickly.
        let mut c = Config::new("http://127.0.0.1:9");
        c.policy.max_attempts = Some(1);
        c.policy.deadline = Some(500);
        c.workers = 1;
        c.queue = 4;
        c.max_body = 256;
        c.header_timeout = Duration::from_millis(50);
        c.body_timeout = Duration::from_millis(50);
        c.admission.rate_per_sec = 0;
        let mut creds = Credentials::new();
        creds.insert(DEVICE, digest(TOKEN.as_bytes()));
        c.auth = Auth::Bearer(Arc::new(creds));
        let gw = rt.block_on(async { Arc::new(Gateway::start(c, Box::new(std::io::sink())).unwrap()) });
        World { rt, gw }
    })
}

fuzz_target!(|data: &[u8]| {
    // The credentials reader and the bearer check, on their own.
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(c) = text.parse::<Credentials>()
    {
        let _ = c.identify(Some(data), Some(DEVICE));
    }
    let creds: Credentials = format!("{DEVICE:016x} {}", hex(&digest(TOKEN.as_bytes()))).parse().unwrap();
    assert_eq!(creds.identify(Some(data), Some(DEVICE)) == Identity::Device(DEVICE), data.get(..7).is_some_and(|p| p.eq_ignore_ascii_case(b"bearer ")) && data.get(7..).map(<[u8]>::trim_ascii) == Some(TOKEN.as_bytes()));

    // The connection.
    let Some((&mode, rest)) = data.split_first() else { return };
    let mut bytes = rest.to_vec();
    if mode & 1 == 1 {
        // Replace the first `$T` with the token, so the fuzzer's requests get past the check.
        if let Some(at) = bytes.windows(2).position(|w| w == b"$T") {
            bytes.splice(at..at + 2, TOKEN.bytes());
        }
    }
    let has_token = bytes.windows(TOKEN.len()).any(|w| w == TOKEN.as_bytes());
    let w = world();
    let before = w.gw.metrics().stats.attempts();
    let answer = w.rt.block_on(async {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let conn = tokio::spawn(wary_gateway::ingress::serve_connection(w.gw.clone(), server));
        let _ = client.write_all(&bytes).await;
        let _ = client.shutdown().await;
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(2), client.read_to_end(&mut out)).await;
        conn.abort();
        out
    });
    if !has_token {
        assert_eq!(w.gw.metrics().stats.attempts(), before, "a request without the token went upstream");
    }
    // Every answer on the connection starts with a status line the gateway documents.
    let text = String::from_utf8_lossy(&answer);
    for (i, part) in text.split("HTTP/1.1 ").enumerate().skip(1) {
        let status = part.get(..3).unwrap_or_default();
        assert!(STATUSES.contains(&status), "answer {i}: {status:?} in {text:?}");
    }
});

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

//! The one HTTP/1.1 request reader of the test servers, and the checks of what a device's
//! request must carry: the product's wire format, checked here so that nothing made up goes out.

use std::io::Read;

use anyhow::{Context, Result, bail};

/// The longest request head a server reads; the device's is about 200 bytes.
pub const MAX_REQUEST_HEAD: usize = 8 * 1024;

/// A request as a server read it.
#[derive(Debug)]
pub struct Request {
    /// `POST`, as the device sends it.
    pub method: String,
    /// The request target.
    pub path: String,
    /// `HTTP/1.1`, as the device sends it.
    pub version: String,
    /// Names lowercased, values trimmed, in the order sent.
    pub headers: Vec<(String, String)>,
    /// The body bytes read so far (all of them after [`read_body`]).
    pub body: Vec<u8>,
}

/// What a server saw of one request.
#[derive(Debug)]
pub struct Served {
    /// The request target.
    pub path: String,
    /// The request's `Idempotency-Key`.
    pub key: String,
    /// What was wrong with it; empty if it is what the device must send.
    pub problems: Vec<String>,
}

/// What a server expects of the device's request besides the fixed parts (POST, HTTP/1.1,
/// `Content-Type: application/json`, `Connection: close`, a 32-hex-digit `Idempotency-Key`, a
/// `Content-Length`).
#[derive(Clone, Copy, Debug)]
pub struct Expect<'a> {
    /// The request target, when one is fixed.
    pub path: Option<&'a str>,
    /// The `Host` header.
    pub host: &'a str,
}

impl Request {
    /// The first header named `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// The request's `Idempotency-Key`, or an empty string.
    pub fn key(&self) -> String {
        self.header("idempotency-key").unwrap_or_default().to_owned()
    }

    /// Everything that is not what the device must send, each named; the body is checked only
    /// when it was read (`whole`).
    pub fn problems(&self, expect: Expect<'_>, whole: bool) -> Vec<String> {
        let mut problems = vec![];
        if self.method != "POST" {
            problems.push(format!("method {:?}, expected POST", self.method));
        }
        if let Some(path) = expect.path
            && self.path != path
        {
            problems.push(format!("path {:?}, expected {path:?}", self.path));
        }
        if self.version != "HTTP/1.1" {
            problems.push(format!("version {:?}, expected HTTP/1.1", self.version));
        }
        if self.header("host") != Some(expect.host) {
            problems.push(format!("Host {:?}, expected {:?}", self.header("host"), expect.host));
        }
        if self.header("content-type") != Some("application/json") {
            problems.push(format!("Content-Type {:?}", self.header("content-type")));
        }
        // No `Connection` header asks for HTTP/1.1's persistent connection (the uplink's kept
        // connections), which these servers end by answering `Connection: close`; any other
        // value than `close` is not something the device sends.
        if self.header("connection").is_some_and(|v| v != "close") {
            problems.push(format!("Connection {:?}, expected close or none", self.header("connection")));
        }
        let key = self.header("idempotency-key").unwrap_or_default();
        if key.len() != 32 || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
            problems.push(format!("Idempotency-Key {key:?} is not 32 hex digits"));
        }
        let declared = self.header("content-length").and_then(|v| v.parse::<usize>().ok());
        if declared.is_none() {
            problems.push("no Content-Length".into());
        }
        if !whole {
            return problems;
        }
        if declared.is_some() && declared != Some(self.body.len()) {
            problems.push(format!("Content-Length {declared:?} but {} body bytes", self.body.len()));
        }
        let json: Result<serde_json::Value, _> = serde_json::from_slice(&self.body);
        if !json.is_ok_and(|v| v.is_object()) {
            problems.push("body is not a JSON object".into());
        }
        problems
    }
}

/// Reads the request head (up to [`MAX_REQUEST_HEAD`] bytes) and any body bytes that came
/// with it.
pub fn read_head<S: Read>(stream: &mut S) -> Result<Request> {
    let mut data = vec![];
    let mut buf = [0u8; 1024];
    let head_end = loop {
        if let Some(at) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        if data.len() > MAX_REQUEST_HEAD {
            bail!("request head longer than {MAX_REQUEST_HEAD} bytes");
        }
        let n = stream.read(&mut buf).context("reading the request head")?;
        if n == 0 {
            bail!("connection closed inside the request head");
        }
        data.extend_from_slice(buf.get(..n).unwrap_or_default());
    };
    let head = data.get(..head_end).unwrap_or_default();
    let head = std::str::from_utf8(head).context("request head is not UTF-8")?;
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (method, path, version) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(m), Some(p), Some(v), None) => (m.to_owned(), p.to_owned(), v.to_owned()),
        _ => bail!("request line {request_line:?} is not `METHOD PATH VERSION`"),
    };
    let mut headers = vec![];
    for line in lines {
        let (name, value) =
            line.split_once(':').with_context(|| format!("header line {line:?} has no colon"))?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }
    let body = data.get(head_end.saturating_add(4)..).unwrap_or_default().to_vec();
    Ok(Request { method, path, version, headers, body })
}

/// Reads the rest of the `Content-Length` body.
pub fn read_body<S: Read>(stream: &mut S, request: &mut Request) -> Result<()> {
    let mut buf = [0u8; 1024];
    let want = request.header("content-length").and_then(|v| v.parse::<usize>().ok()).unwrap_or(0);
    while request.body.len() < want {
        let n = stream.read(&mut buf).context("reading the request body")?;
        if n == 0 {
            bail!("connection closed inside the body ({} of {want} bytes)", request.body.len());
        }
        request.body.extend_from_slice(buf.get(..n).unwrap_or_default());
    }
    Ok(())
}

/// [`read_head`] then [`read_body`]: the whole request.
pub fn read_request<S: Read>(stream: &mut S) -> Result<Request> {
    let mut request = read_head(stream)?;
    read_body(stream, &mut request)?;
    Ok(request)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXPECT: Expect<'static> = Expect { path: Some("/readings"), host: "cloud.wary.test" };

    fn read(bytes: &[u8]) -> Result<Request> {
        read_request(&mut &bytes[..])
    }

    #[test]
    fn a_device_request_has_no_problems() {
        let body = br#"{"seq":1,"mC":21000}"#;
        let mut wire = format!(
            "POST /readings HTTP/1.1\r\nHost: cloud.wary.test\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nIdempotency-Key: 0a386001000000000000000000000001\r\n\
             Connection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        wire.extend_from_slice(body);
        let request = read(&wire).unwrap();
        assert_eq!(request.body, body);
        assert_eq!(request.key(), "0a386001000000000000000000000001");
        assert_eq!(request.problems(EXPECT, true), Vec::<String>::new());
        // The same request on a kept connection: no `Connection` header.
        let kept = String::from_utf8_lossy(&wire).replace("Connection: close\r\n", "");
        assert_eq!(read(kept.as_bytes()).unwrap().problems(EXPECT, true), Vec::<String>::new());
    }

    #[test]
    fn each_missing_piece_is_named() {
        let request =
            read(b"GET /other HTTP/1.0\r\nConnection: upgrade\r\nContent-Length: 2\r\n\r\n[]").unwrap();
        let text = request.problems(EXPECT, true).join("; ");
        for what in
            ["method", "path", "version", "Host", "Content-Type", "Connection", "Idempotency-Key", "JSON"]
        {
            assert!(text.contains(what), "{what} not named in {text}");
        }
        let short = read(b"POST /readings HTTP/1.1\r\n\r\n").unwrap();
        assert!(short.problems(EXPECT, false).iter().any(|p| p == "no Content-Length"));
    }

    #[test]
    fn a_cut_or_malformed_request_is_an_error() {
        assert!(read(b"POST /readings HTTP/1.1\r\nHost: x\r\n").is_err());
        assert!(read(b"POST /readings\r\n\r\n").is_err());
        assert!(read(b"POST / HTTP/1.1\r\nno colon here\r\n\r\n").is_err());
        assert!(read(b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nshort").is_err());
        assert!(read(&[b'a'; MAX_REQUEST_HEAD + 2048]).is_err());
    }
}

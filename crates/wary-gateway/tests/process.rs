//! The binary as it is deployed: credentials and certificate reloaded on SIGHUP without
//! dropping a connection, and running out of file descriptors waited out.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, missing_docs)]

use std::io::Read;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use wary_cloud::{Cloud, Faults};
use wary_gateway::Credentials;

#[path = "common/tls.rs"]
mod tls;

const BIN: &str = env!("CARGO_BIN_EXE_wary-gateway");

async fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port()
}

async fn wait_listening(addr: SocketAddr) {
    for _ in 0..200 {
        if TcpStream::connect(addr).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the gateway did not start listening");
}

fn stop(mut child: Child) -> String {
    child.kill().unwrap();
    child.wait().unwrap();
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    err
}

fn post(addr: SocketAddr, token: &str, key: &str) -> Request<Full<Bytes>> {
    Request::post(format!("https://{addr}/readings"))
        .header("authorization", format!("Bearer {token}"))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap()
}

fn key(device: u64, boot: u32, seq: u32) -> String {
    format!("{device:016x}{boot:08x}{seq:08x}")
}

#[tokio::test]
async fn sighup_reloads_credentials_and_certificate_and_keeps_open_connections() {
    let limit = Duration::from_secs(30);
    tokio::time::timeout(limit, async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        let dir = tls::temp_dir("sighup");
        let (ca1, cert, key_file) = tls::issue(&dir, "gw");
        let creds = dir.join("credentials");
        let (ta, la) = Credentials::issue(0xa1);
        let (tb, lb) = Credentials::issue(0xb2);
        std::fs::write(&creds, format!("# the fleet\n{la}\n")).unwrap();
        let port = free_port().await;
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let child = Command::new(BIN)
            .args(["--listen", &addr.to_string(), "--upstream", &cloud.url(""), "--no-metrics"])
            .arg("--credentials")
            .arg(&creds)
            .arg("--tls-cert")
            .arg(&cert)
            .arg("--tls-key")
            .arg(&key_file)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id().to_string();
        wait_listening(addr).await;
        let mut kept = tls::connect(addr, &ca1).await.unwrap();
        assert_eq!(tls::send(&mut kept, post(addr, &ta, &key(0xa1, 1, 0))).await.0, StatusCode::CREATED);
        assert_eq!(tls::send(&mut kept, post(addr, &tb, &key(0xb2, 1, 0))).await.0, StatusCode::UNAUTHORIZED);
        // A new device and a new certificate (another CA), then SIGHUP.
        std::fs::write(&creds, format!("{la}\n{lb}\n")).unwrap();
        let (ca2, cert2, key2) = tls::issue(&dir, "next");
        std::fs::rename(&cert2, &cert).unwrap();
        std::fs::rename(&key2, &key_file).unwrap();
        assert!(Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
        let mut reloaded = None;
        for _ in 0..100 {
            if let Ok(s) = tls::connect(addr, &ca2).await {
                reloaded = Some(s);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut fresh = reloaded.expect("the new certificate was never served");
        assert_eq!(tls::send(&mut fresh, post(addr, &tb, &key(0xb2, 1, 0))).await.0, StatusCode::CREATED);
        // The connection opened before the reload is still open, and still served.
        assert_eq!(tls::send(&mut kept, post(addr, &ta, &key(0xa1, 1, 1))).await.0, StatusCode::CREATED);
        // A new connection trusting only the old CA no longer gets through.
        assert!(tls::connect(addr, &ca1).await.is_err());
        // A broken file on the next SIGHUP keeps the credentials in force.
        std::fs::write(&creds, "not a credentials line\n").unwrap();
        assert!(Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(tls::send(&mut fresh, post(addr, &tb, &key(0xb2, 1, 1))).await.0, StatusCode::CREATED);
        let err = stop(child);
        assert!(err.contains("reloaded 2 device credentials"), "{err}");
        assert!(err.contains("credentials not reloaded, the old ones stay: line 1"), "{err}");
        assert!(!err.contains(&ta) && !err.contains(&tb), "a token reached the output");
        assert!(!err.contains(la.split(' ').nth(1).unwrap()), "a digest reached the output");
        assert_eq!(cloud.stats().keys, 4);
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
    .expect("test took too long");
}

#[tokio::test]
async fn running_out_of_file_descriptors_does_not_stop_the_gateway() {
    let limit = Duration::from_secs(30);
    tokio::time::timeout(limit, async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        let port = free_port().await;
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        // 48 descriptors: a few dozen connections exhaust them.
        let script = format!(
            "ulimit -n 48 && exec {BIN} --listen {addr} --upstream {} --no-metrics --insecure-no-auth --insecure-plain-http --workers 2 --threads 1",
            cloud.url("")
        );
        let child = Command::new("sh")
            .args(["-c", &script])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_listening(addr).await;
        let mut held = Vec::new();
        for _ in 0..80 {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(b"POST /readings HTTP/1.1\r\nHost: g\r\n").await.unwrap();
            held.push(s);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        drop(held);
        // Descriptors free again: the gateway serves, after its accept back-off (at most 1 s).
        let req = Request::post(format!("http://{addr}/readings"))
            .header("idempotency-key", key(1, 1, 0))
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let resp = client.request(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::CREATED);
        let _ = resp.into_body().collect().await;
        assert_eq!(cloud.key_stats(&key(1, 1, 0)).unwrap().effects, 1);
        let err = stop(child);
        assert!(err.contains("accept failed ("), "the descriptors never ran out: {err}");
    })
    .await
    .expect("test took too long");
}

#[test]
fn credential_new_prints_a_token_once_and_the_line_that_admits_it() {
    let out = Command::new(BIN).args(["credential", "new", "0123456789abcdef"]).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let token =
        text.lines().find_map(|l| l.strip_prefix("token (give it to the device; it is not kept): ")).unwrap();
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("credentials line (append to the gateway's file): "))
        .unwrap();
    assert_eq!(token.len(), 64);
    assert!(!line.contains(token), "the file line holds the digest, not the token");
    let creds: Credentials = line.parse().unwrap();
    let header = format!("Bearer {token}");
    assert_eq!(
        creds.identify(Some(header.as_bytes()), Some(0x0123_4567_89ab_cdef)),
        wary_gateway::Identity::Device(0x0123_4567_89ab_cdef)
    );
    // A bad device id is refused.
    let bad = Command::new(BIN).args(["credential", "new", "12345"]).output().unwrap();
    assert!(!bad.status.success());
    // The gateway will not start without credentials and TLS, or the flags that waive them.
    let bare = Command::new(BIN).args(["--upstream", "http://127.0.0.1:9"]).output().unwrap();
    let err = String::from_utf8_lossy(&bare.stderr);
    assert!(!bare.status.success() && err.contains("--credentials") && err.contains("--tls-cert"), "{err}");
}

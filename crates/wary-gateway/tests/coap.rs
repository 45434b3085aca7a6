//! The gateway's CoAP ingress over real UDP sockets, in front of the test cloud: what a device
//! sending confirmable `POST /r/<key>` hears, and what reaches the upstream. The binary is run
//! for its start-up rule (no CoAP without `--insecure-no-auth`), and libcoap's client, when
//! installed, checks that a CoAP stack we did not write gets its answer.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, missing_docs)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use coap_lite::option_value::OptionValueU32;
use coap_lite::{CoapOption, ContentFormat, MessageClass, MessageType, Packet, RequestType, ResponseType};
use http::StatusCode;
use tokio::net::UdpSocket;
use wary::Key;
use wary_cloud::{Cloud, Faults};
use wary_gateway::coap::{CoapConfig, Ingress};
use wary_gateway::{Config, Gateway};
use wary_host::spec::PolicySpec;

const BIN: &str = env!("CARGO_BIN_EXE_wary-gateway");
const TEST_LIMIT: Duration = Duration::from_secs(20);

async fn within(body: impl std::future::Future<Output = ()>) {
    tokio::time::timeout(TEST_LIMIT, body).await.expect("test took too long");
}

fn config(base: &str) -> Config {
    let mut c = Config::new(base);
    c.policy = PolicySpec {
        base: Some(10),
        cap: Some(100),
        budget: Some(1_000),
        deadline: Some(3_000),
        min_attempt: Some(50),
        ..PolicySpec::default()
    };
    c.upstream.attempt_timeout = Duration::from_millis(2_000);
    c.fleet_max_tokens = 1000;
    c.fleet_ratio_milli = 1000;
    c.workers = 4;
    c.queue = 16;
    c.seed = Some(7);
    c.auth = wary_gateway::Auth::Open;
    c
}

/// A gateway with its CoAP ingress on a free loopback UDP port, and the HTTP ingress beside it.
async fn gateway(config: Config, coap: CoapConfig) -> (Arc<Gateway>, Ingress, SocketAddr) {
    let gw = Arc::new(Gateway::start(config, Box::new(std::io::sink())).unwrap());
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let ingress = Ingress::start(gw.clone(), socket, coap).unwrap();
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http_addr = http.local_addr().unwrap();
    tokio::spawn(wary_gateway::ingress::serve(gw.clone(), http));
    (gw, ingress, http_addr)
}

fn key(n: u32) -> String {
    Key::from_parts(1, 1, n).to_hex().as_str().to_owned()
}

/// A confirmable request as a device sends it.
fn request(method: RequestType, path: &[&str], mid: u16, token: &[u8], body: &str) -> Vec<u8> {
    let mut p = Packet::new();
    p.header.set_type(MessageType::Confirmable);
    p.header.code = MessageClass::Request(method);
    p.header.message_id = mid;
    p.set_token(token.to_vec());
    for segment in path {
        p.add_option(CoapOption::UriPath, segment.as_bytes().to_vec());
    }
    p.set_content_format(ContentFormat::ApplicationJSON);
    p.payload = body.as_bytes().to_vec();
    p.to_bytes().unwrap()
}

fn post(k: &str, mid: u16, body: &str) -> Vec<u8> {
    request(RequestType::Post, &["r", k], mid, &mid.to_be_bytes(), body)
}

async fn device() -> UdpSocket {
    UdpSocket::bind("127.0.0.1:0").await.unwrap()
}

async fn receive(socket: &UdpSocket) -> (Vec<u8>, Packet) {
    let mut buf = vec![0u8; 2048];
    let n = tokio::time::timeout(Duration::from_secs(10), socket.recv(&mut buf))
        .await
        .expect("no answer")
        .unwrap();
    buf.truncate(n);
    let p = Packet::from_bytes(&buf).unwrap();
    (buf, p)
}

/// Sends `datagram` and returns the answer.
async fn exchange(socket: &UdpSocket, to: SocketAddr, datagram: &[u8]) -> (Vec<u8>, Packet) {
    socket.send_to(datagram, to).await.unwrap();
    receive(socket).await
}

/// Sends `datagram` and returns the verdict: piggybacked, or after an empty ACK the separate
/// response, which it acknowledges.
async fn verdict(socket: &UdpSocket, to: SocketAddr, datagram: &[u8]) -> Packet {
    let (_, first) = exchange(socket, to, datagram).await;
    if first.header.code != MessageClass::Empty {
        return first;
    }
    let (_, response) = receive(socket).await;
    assert_eq!(response.header.get_type(), MessageType::Confirmable);
    let mut ack = Packet::new();
    ack.header.set_type(MessageType::Acknowledgement);
    ack.header.code = MessageClass::Empty;
    ack.header.message_id = response.header.message_id;
    socket.send_to(&ack.to_bytes().unwrap(), to).await.unwrap();
    response
}

fn code(p: &Packet) -> MessageClass {
    p.header.code
}

fn max_age(p: &Packet) -> Option<u32> {
    p.get_first_option_as::<OptionValueU32>(CoapOption::MaxAge).map(|v| v.unwrap().0)
}

#[tokio::test]
async fn a_reading_lands_once_and_the_ack_carries_the_verdict() {
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        let (_gw, ingress, _) = gateway(config(&cloud.url("")), CoapConfig::default()).await;
        let dev = device().await;
        let request = post(&key(1), 0x1234, r#"{"seq":1,"mC":21000}"#);
        let (answer, ack) = exchange(&dev, ingress.local_addr(), &request).await;
        println!("request {} B, piggybacked answer {} B (UDP payloads)", request.len(), answer.len());
        assert_eq!(ack.header.get_type(), MessageType::Acknowledgement, "piggybacked on the ACK");
        assert_eq!(ack.header.message_id, 0x1234);
        assert_eq!(ack.get_token(), &0x1234u16.to_be_bytes());
        assert_eq!(code(&ack), MessageClass::Response(ResponseType::Created));
        assert_eq!(ack.get_content_format(), Some(ContentFormat::ApplicationJSON));
        assert!(
            serde_json::from_slice::<serde_json::Value>(&ack.payload).is_ok(),
            "the upstream's JSON body"
        );
        let stats = cloud.key_stats(&key(1)).unwrap();
        assert_eq!(stats.effects, 1);
        assert_eq!(stats.body_len, r#"{"seq":1,"mC":21000}"#.len(), "the payload went upstream unchanged");
        assert_eq!(cloud.stats().requests, 1);
        assert_eq!(ingress.counts().piggybacked.load(Ordering::Relaxed), 1);
    })
    .await;
}

#[tokio::test]
async fn a_retransmitted_message_id_gets_the_same_answer_from_memory() {
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        let (gw, ingress, _) = gateway(config(&cloud.url("")), CoapConfig::default()).await;
        let dev = device().await;
        let datagram = post(&key(2), 7, "{}");
        let (first, _) = exchange(&dev, ingress.local_addr(), &datagram).await;
        let (second, _) = exchange(&dev, ingress.local_addr(), &datagram).await;
        assert_eq!(first, second, "the same bytes: the first answer, remembered");
        assert_eq!(cloud.stats().requests, 1, "one upstream call for one message ID");
        assert_eq!(ingress.counts().duplicates.load(Ordering::Relaxed), 1);
        let text = gw.prometheus();
        assert!(text.contains("wary_gateway_coap_duplicates_total 1\n"), "{text}");
        assert!(text.contains("wary_gateway_coap_exchanges_total 1\n"), "{text}");
        // Another device (another port) may use the same message ID: its own exchange.
        let other = device().await;
        let (_, ack) = exchange(&other, ingress.local_addr(), &post(&key(3), 7, "{}")).await;
        assert_eq!(code(&ack), MessageClass::Response(ResponseType::Created));
        assert_eq!(cloud.stats().requests, 2);
        // A resend with a new message ID is a new exchange: upstream again, where the key
        // keeps it from a second effect.
        let (_, ack) = exchange(&dev, ingress.local_addr(), &post(&key(2), 8, "{}")).await;
        assert!(matches!(code(&ack), MessageClass::Response(ResponseType::Created | ResponseType::Changed)));
        assert_eq!(cloud.stats().requests, 3);
        assert_eq!(cloud.key_stats(&key(2)).unwrap().effects, 1);
    })
    .await;
}

#[tokio::test]
async fn a_slow_verdict_comes_as_a_separate_response_after_an_empty_ack() {
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", "slow=1.0:ms=600".parse::<Faults>().unwrap()).await.unwrap();
        let coap = CoapConfig { piggyback_wait: Duration::from_millis(50), ..CoapConfig::default() };
        let (_gw, ingress, _) = gateway(config(&cloud.url("")), coap).await;
        let dev = device().await;
        let datagram = post(&key(4), 40, "{}");
        let (_, empty) = exchange(&dev, ingress.local_addr(), &datagram).await;
        assert_eq!(empty.header.get_type(), MessageType::Acknowledgement);
        assert_eq!(code(&empty), MessageClass::Empty);
        assert_eq!(empty.header.message_id, 40);
        // The device, not having seen that ACK, retransmits: the empty ACK again, no new call.
        let (_, again) = exchange(&dev, ingress.local_addr(), &datagram).await;
        assert_eq!(
            (again.header.get_type(), code(&again)),
            (MessageType::Acknowledgement, MessageClass::Empty)
        );
        let (_, response) = receive(&dev).await;
        assert_eq!(
            response.header.get_type(),
            MessageType::Confirmable,
            "a separate response is confirmable"
        );
        assert_eq!(response.get_token(), &40u16.to_be_bytes(), "matched to the request by its token");
        assert_eq!(code(&response), MessageClass::Response(ResponseType::Created));
        let mut ack = Packet::new();
        ack.header.set_type(MessageType::Acknowledgement);
        ack.header.code = MessageClass::Empty;
        ack.header.message_id = response.header.message_id;
        dev.send_to(&ack.to_bytes().unwrap(), ingress.local_addr()).await.unwrap();
        assert_eq!(cloud.stats().requests, 1);
        assert_eq!(ingress.counts().separate.load(Ordering::Relaxed), 1);
        // The request's retransmission after the verdict (a device that stopped listening): the
        // empty ACK and the same response again, from memory, never a second call.
        let (_, late) = exchange(&dev, ingress.local_addr(), &datagram).await;
        assert_eq!(code(&late), MessageClass::Empty);
        let (_, again) = receive(&dev).await;
        assert_eq!(again, response, "the same separate response, same message ID");
        assert_eq!(cloud.stats().requests, 1);
    })
    .await;
}

#[tokio::test]
async fn a_give_up_is_5_03_with_max_age_the_retry_after() {
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", "503=1.0".parse::<Faults>().unwrap()).await.unwrap();
        let mut c = config(&cloud.url(""));
        // No Retry-After upstream: a give-up asks for the policy's cap, 4.5 s, rounded up to 5.
        c.policy.cap = Some(4_500);
        let (gw, ingress, http) = gateway(c, CoapConfig::default()).await;
        let dev = device().await;
        let ack = verdict(&dev, ingress.local_addr(), &post(&key(5), 50, "{}")).await;
        assert_eq!(code(&ack), MessageClass::Response(ResponseType::ServiceUnavailable));
        // The HTTP ingress's Retry-After for the same give-up is the CoAP Max-Age.
        let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(hyper_util::client::legacy::connect::HttpConnector::new());
        let req = http::Request::post(format!("http://{http}/readings"))
            .header("content-type", "application/json")
            .header("idempotency-key", key(6))
            .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
            .unwrap();
        let resp = client.request(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        let retry_after: u32 = resp.headers()["retry-after"].to_str().unwrap().parse().unwrap();
        assert_eq!(retry_after, 5);
        assert_eq!(max_age(&ack), Some(retry_after));
        assert_eq!(gw.metrics().verdicts.get("gave_up"), Some(&2));
        assert_eq!(cloud.key_stats(&key(5)).map_or(0, |s| s.effects), 0);
    })
    .await;
}

#[tokio::test]
async fn what_the_gateway_refuses_is_never_forwarded() {
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        let (gw, ingress, _) = gateway(config(&cloud.url("")), CoapConfig::default()).await;
        let dev = device().await;
        let to = ingress.local_addr();
        // A key with hex letters, written in capitals.
        let upper = Key::from_parts(0xabcd, 1, 7).to_hex().as_str().to_uppercase();
        let cases: [(Vec<u8>, ResponseType); 6] = [
            (post("not-a-key", 1, "{}"), ResponseType::BadRequest),
            (post(&upper, 2, "{}"), ResponseType::BadRequest),
            (post(&key(7)[..31], 3, "{}"), ResponseType::BadRequest),
            (post(&key(7), 4, "not json"), ResponseType::BadRequest),
            (request(RequestType::Post, &["readings"], 5, b"t", "{}"), ResponseType::NotFound),
            (request(RequestType::Get, &["r", &key(7)], 6, b"t", ""), ResponseType::MethodNotAllowed),
        ];
        for (datagram, want) in &cases {
            let (_, ack) = exchange(&dev, to, datagram).await;
            assert_eq!(
                code(&ack),
                MessageClass::Response(*want),
                "{:?}",
                Packet::from_bytes(datagram).unwrap()
            );
        }
        // An unknown critical option (65001, odd) is 4.02.
        let mut p = Packet::from_bytes(&post(&key(7), 9, "{}")).unwrap();
        p.add_option(CoapOption::Unknown(65001), vec![1]);
        let (_, ack) = exchange(&dev, to, &p.to_bytes().unwrap()).await;
        assert_eq!(code(&ack), MessageClass::Response(ResponseType::BadOption));
        // A non-confirmable request cannot be answered after its verdict: Reset.
        let mut p = Packet::from_bytes(&post(&key(7), 10, "{}")).unwrap();
        p.header.set_type(MessageType::NonConfirmable);
        let (_, rst) = exchange(&dev, to, &p.to_bytes().unwrap()).await;
        assert_eq!((rst.header.get_type(), rst.header.message_id), (MessageType::Reset, 10));
        assert_eq!(cloud.stats().requests, 0, "nothing refused went upstream");
        assert_eq!(gw.metrics().refused.get("bad_request"), Some(&7));
    })
    .await;
}

#[tokio::test]
async fn the_binary_refuses_coap_without_insecure_no_auth_and_serves_it_with() {
    let dir = std::env::temp_dir().join(format!("wary-gw-coap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let creds = dir.join("credentials");
    std::fs::write(&creds, format!("{:016x} {}\n", 1, "0".repeat(64))).unwrap();
    let out = Command::new(BIN)
        .args(["--upstream", "http://127.0.0.1:9", "--insecure-plain-http", "--no-metrics"])
        .args(["--listen", "127.0.0.1:0", "--coap", "127.0.0.1:0", "--credentials"])
        .arg(&creds)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--insecure-no-auth"), "says what it needs: {err}");
    assert!(!err.contains("coap on"), "never listened: {err}");
    std::fs::remove_dir_all(&dir).unwrap();
    // With it, the ingress starts, says it is unauthenticated, and a reading lands through it.
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        let mut child = Command::new(BIN)
            .args(["--upstream", &cloud.url(""), "--insecure-plain-http", "--no-metrics"])
            .args(["--listen", "127.0.0.1:0", "--coap", "127.0.0.1:0", "--insecure-no-auth"])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let _child = KillOnDrop(child);
        // Read its output to the end (a closed pipe would fail its later writes); the line
        // naming the CoAP address comes back first.
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("coap on coap://127.0.0.1:")
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(line);
                }
            }
        });
        let started = rx.await.ok();
        let started = started.expect("the CoAP ingress started");
        assert!(started.contains("no authentication"), "{started}");
        let addr: SocketAddr =
            started.split("coap://").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
        let dev = device().await;
        let ack = verdict(&dev, addr, &post(&key(13), 130, r#"{"seq":13}"#)).await;
        assert_eq!(code(&ack), MessageClass::Response(ResponseType::Created));
        assert_eq!(cloud.key_stats(&key(13)).unwrap().effects, 1);
    })
    .await;
}

#[tokio::test]
async fn libcoaps_client_gets_its_answer() {
    let Ok(path) = which("coap-client-notls") else {
        eprintln!("coap-client-notls is not installed (Debian package libcoap3-bin): skipped");
        return;
    };
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        let (_gw, ingress, _) = gateway(config(&cloud.url("")), CoapConfig::default()).await;
        let k = key(8);
        let uri = format!("coap://{}/r/{k}", ingress.local_addr());
        let out = tokio::task::spawn_blocking(move || {
            Command::new(path)
                .args(["-m", "post", "-t", "json", "-B", "5", &uri, "-e", r#"{"seq":8}"#])
                .output()
        })
        .await
        .unwrap()
        .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(cloud.key_stats(&k).unwrap().effects, 1);
        assert_eq!(cloud.stats().requests, 1);
    })
    .await;
}

/// A gateway process, killed when the test ends however it ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn which(name: &str) -> Result<std::path::PathBuf, ()> {
    std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|d| d.join(name)).find(|p| p.is_file()))
        .ok_or(())
}

#[tokio::test]
async fn an_upstream_refusal_is_its_own_4xx_and_never_resent() {
    within(async {
        // The first key is one the upstream can never take: 422, which CoAP has as 4.22.
        let cloud = Cloud::start("127.0.0.1:0", "poison=1".parse::<Faults>().unwrap()).await.unwrap();
        let (gw, ingress, _) = gateway(config(&cloud.url("")), CoapConfig::default()).await;
        let dev = device().await;
        let ack = verdict(&dev, ingress.local_addr(), &post(&key(9), 90, "{}")).await;
        assert_eq!(code(&ack), MessageClass::Response(ResponseType::UnprocessableEntity));
        assert_eq!(max_age(&ack), None);
        assert_eq!(cloud.stats().requests, 1, "a failed call is not retried");
        assert_eq!(gw.metrics().verdicts.get("failed"), Some(&1));
        // The reading's fault holds nothing: the next one lands.
        let ack = verdict(&dev, ingress.local_addr(), &post(&key(10), 91, "{}")).await;
        assert_eq!(code(&ack), MessageClass::Response(ResponseType::Created));
    })
    .await;
}

/// The upstream refuses the gateway's credential (401) for 2.5 s: a CoAP device gets 5.03 with
/// Max-Age (the breaker's open time left), never the 4.xx of a failure, and its reading lands
/// once the credential is good again.
#[tokio::test]
async fn an_upstream_refusing_the_gateway_is_5_03_with_max_age() {
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", "outage=0:ms=2500:status=401".parse::<Faults>().unwrap())
            .await
            .unwrap();
        let (gw, ingress, _) = gateway(config(&cloud.url("")), CoapConfig::default()).await;
        let dev = device().await;
        let mut mid = 700;
        let mut held = 0;
        loop {
            mid += 1;
            let ack = verdict(&dev, ingress.local_addr(), &post(&key(11), mid, "{}")).await;
            if code(&ack) == MessageClass::Response(ResponseType::Created) {
                break;
            }
            assert_eq!(code(&ack), MessageClass::Response(ResponseType::ServiceUnavailable));
            let age = max_age(&ack).expect("a Max-Age");
            assert!((1..=4).contains(&age), "Max-Age {age}");
            held += 1;
            assert!(held < 10, "never landed");
            tokio::time::sleep(Duration::from_secs(u64::from(age))).await;
        }
        assert!(held >= 1);
        assert_eq!(cloud.key_stats(&key(11)).unwrap().effects, 1);
        assert!(gw.prometheus().contains(&format!("\nwary_gateway_held_total{{status=\"401\"}} {held}\n")));
    })
    .await;
}

#[tokio::test]
async fn a_payload_over_the_limit_is_4_13_with_size1() {
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        let mut c = config(&cloud.url(""));
        c.max_body = 16;
        let (_gw, ingress, _) = gateway(c, CoapConfig::default()).await;
        let dev = device().await;
        let (_, ack) =
            exchange(&dev, ingress.local_addr(), &post(&key(10), 100, r#"{"padding":"0123456789"}"#)).await;
        assert_eq!(code(&ack), MessageClass::Response(ResponseType::RequestEntityTooLarge));
        let size1 = ack.get_first_option_as::<OptionValueU32>(CoapOption::Size1).map(|v| v.unwrap().0);
        assert_eq!(size1, Some(16));
        assert_eq!(cloud.stats().requests, 0);
    })
    .await;
}

#[tokio::test]
async fn a_message_id_is_remembered_for_the_exchange_lifetime_only() {
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", Faults::none()).await.unwrap();
        // A lifetime of zero: every message is past it when the next one comes.
        let coap = CoapConfig { exchange_lifetime: Duration::ZERO, ..CoapConfig::default() };
        let (_gw, ingress, _) = gateway(config(&cloud.url("")), coap).await;
        let dev = device().await;
        let datagram = post(&key(11), 110, "{}");
        let (_, first) = exchange(&dev, ingress.local_addr(), &datagram).await;
        let (_, second) = exchange(&dev, ingress.local_addr(), &datagram).await;
        assert_eq!(code(&first), MessageClass::Response(ResponseType::Created));
        // Forgotten, so forwarded again: the upstream's key store answers it as a replay.
        assert!(matches!(
            code(&second),
            MessageClass::Response(ResponseType::Created | ResponseType::Changed)
        ));
        assert_eq!(cloud.stats().requests, 2);
        assert_eq!(cloud.key_stats(&key(11)).unwrap().effects, 1);
        assert_eq!(ingress.counts().duplicates.load(Ordering::Relaxed), 0);
    })
    .await;
}

#[tokio::test]
async fn an_unacknowledged_separate_response_is_retransmitted_max_retransmit_times() {
    within(async {
        let cloud = Cloud::start("127.0.0.1:0", "slow=1.0:ms=300".parse::<Faults>().unwrap()).await.unwrap();
        let coap = CoapConfig {
            piggyback_wait: Duration::from_millis(20),
            ack_timeout: Duration::from_millis(30),
            max_retransmit: 2,
            ..CoapConfig::default()
        };
        let (_gw, ingress, _) = gateway(config(&cloud.url("")), coap).await;
        let dev = device().await;
        let (_, empty) = exchange(&dev, ingress.local_addr(), &post(&key(12), 120, "{}")).await;
        assert_eq!(code(&empty), MessageClass::Empty);
        // The device never acknowledges: the first transmission and 2 retransmissions, the
        // same message each time.
        let mut copies = Vec::new();
        for _ in 0..3 {
            copies.push(receive(&dev).await.0);
        }
        assert!(copies.iter().all(|c| *c == copies[0]), "the same message, same ID");
        let response = Packet::from_bytes(&copies[0]).unwrap();
        assert_eq!(response.header.get_type(), MessageType::Confirmable);
        assert_eq!(code(&response), MessageClass::Response(ResponseType::Created));
        // Then it stops: nothing more comes, and it is counted.
        let mut buf = [0u8; 64];
        let more = tokio::time::timeout(Duration::from_millis(1_000), dev.recv(&mut buf)).await;
        assert!(more.is_err(), "no fourth transmission");
        assert_eq!(ingress.counts().separate_unacknowledged.load(Ordering::Relaxed), 1);
        assert_eq!(cloud.stats().requests, 1);
    })
    .await;
}

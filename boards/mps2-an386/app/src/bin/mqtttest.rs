//! On-target checks of `wary_uplink::mqtt::MqttTransport` (feature `mqtt`), one per row of its
//! outcome table, against the MQTT fault proxy in front of a real mosquitto on the host
//! (`cargo xtask device mqtt` starts both, scripts the proxy in the order below and checks what
//! reached the broker). Each case sends one reading with its own key and checks the answer and
//! how the policy classifies it for a keyed write; the connection counts show where a new
//! connection had to be made.
//!
//! Arguments (semihosting command line): `device=<16 hex> token=<64 hex> port=<proxy> seed=<n>`.

#![no_std]
#![no_main]

use core::net::{Ipv4Addr, SocketAddrV4};

use embassy_executor::Spawner;
use mps2_an386::{exit, exit_code, net};
use static_cell::{ConstStaticCell, StaticCell};
use wary::{Class, Duration, Failure, Operation, retry_after::Rules};
use wary_qemu::{Tally, body};
use wary_uplink::mqtt::{Buffers, BumpBuffer, MqttTransport, SharedSocket, shared_socket};
use wary_uplink::transport::{Answer, Message, outcome};
use wary_uplink::{Credential, POLICY, Transport, parse_device_id};

const HOST: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);
const DHCP_LIMIT: embassy_time::Duration = embassy_time::Duration::from_secs(30);
const LIMIT: Duration = Duration::from_secs(5);

static BUFFERS: ConstStaticCell<Buffers<1024, 1024, 256>> = ConstStaticCell::new(Buffers::new());
static SOCKET: StaticCell<SharedSocket<'static>> = StaticCell::new();
static ARENA: StaticCell<BumpBuffer<'static>> = StaticCell::new();
static LOGIN: StaticCell<Credential> = StaticCell::new();

struct Args {
    device: u64,
    token: Credential,
    port: u16,
    seed: u64,
}

fn args() -> Option<Args> {
    let all = semihosting::experimental::env::args::<512>().ok()?;
    let (mut device, mut token, mut port, mut seed) = (None, None, None, None);
    for arg in &all {
        let Ok(arg) = arg else { continue };
        if let Some(v) = arg.strip_prefix("device=") {
            device = parse_device_id(v);
        } else if let Some(v) = arg.strip_prefix("token=") {
            token = Credential::from_token(v);
        } else if let Some(v) = arg.strip_prefix("port=") {
            port = v.parse().ok();
        } else if let Some(v) = arg.strip_prefix("seed=") {
            seed = v.parse().ok();
        }
    }
    Some(Args { device: device?, token: token?, port: port?, seed: seed? })
}

/// The key of case `n` for `device`, in wary's form.
fn key(device: u64, n: u32) -> heapless::String<32> {
    wary::Key::from_parts(device, 0x7e57, n).to_hex()
}

async fn publish(t: &mut MqttTransport<'_>, device: u64, n: u32) -> Answer {
    t.open(LIMIT).await?;
    let (k, b) = (key(device, n), body(n as usize));
    let mut answers = [Err(Failure::Reset)];
    t.send(&[Message { key: &k, body: b.as_bytes() }], &mut answers, LIMIT).await;
    let [answer] = answers;
    answer
}

fn class(answer: &Answer) -> Class {
    POLICY.classify(Operation::KeyedWrite, &outcome(answer, &Rules::LENIENT).0)
}

fn status(answer: &Answer) -> Option<u16> {
    answer.as_ref().ok().map(|r| r.status)
}

#[embassy_executor::main]
async fn main(spawner: Spawner) {
    let board = mps2_an386::init();
    let mut tally = Tally::new();
    let Some(args) = args() else {
        defmt::error!("no device=, token=, port= and seed= on the semihosting command line");
        exit(exit_code::FAIL)
    };
    let stack = match net::bring_up(spawner, board.eth, args.seed, DHCP_LIMIT).await {
        Ok(stack) => stack,
        Err(err) => {
            defmt::error!("network: {}", err);
            exit(exit_code::FAIL)
        }
    };
    let (rx, tx, arena) = BUFFERS.take().parts();
    let socket = SOCKET.init(shared_socket(stack, rx, tx));
    let arena = ARENA.init(BumpBuffer::new(arena));
    let device = args.device;
    let mut t = MqttTransport::new(
        stack,
        SocketAddrV4::new(HOST, args.port),
        device,
        LOGIN.init(args.token),
        socket,
        arena,
    );

    // The proxy refuses the first three CONNECTs: 0x86, 0x89, 0x97.
    let refused = [
        (401u16, Class::Failed, "0x86 bad user name or password"),
        (503, Class::Retry, "0x89 server busy"),
        (429, Class::Retry, "0x97 quota exceeded"),
    ];
    for (want, want_class, name) in refused {
        let got = t.open(LIMIT).await;
        let ok = got == Err(Failure::status(want))
            && POLICY.classify(Operation::KeyedWrite, &got.err().unwrap_or(Failure::Reset).into())
                == want_class;
        tally.check(name, ok);
    }
    tally.check(
        "mqtt_refused_connack_is_paced: three connects, none accepted",
        t.mqtt_counts().connack_refused == 3,
    );

    // The publishes, in the proxy's script order.
    let a = publish(&mut t, device, 0).await;
    tally.check("mqtt_puback_0x00_lands: 200, ok", status(&a) == Some(200) && class(&a) == Class::Ok);
    let a = publish(&mut t, device, 1).await;
    tally.check(
        "mqtt_puback_0x10_is_resent: 503, retry",
        status(&a) == Some(503) && class(&a) == Class::Retry,
    );
    let a = publish(&mut t, device, 2).await;
    tally.check(
        "mqtt_puback_0x97_throttles: 429 with no Retry-After, retry",
        a.as_ref().is_ok_and(|r| r.status == 429 && r.retry_after.is_empty()) && class(&a) == Class::Retry,
    );
    for (n, want, name) in [
        (3, 403, "mqtt_puback_errors_fail: 0x87 403"),
        (4, 404, "mqtt_puback_errors_fail: 0x90 404"),
        (5, 422, "mqtt_puback_errors_fail: 0x99 422"),
    ] {
        let a = publish(&mut t, device, n).await;
        tally.check(name, status(&a) == Some(want) && class(&a) == Class::Failed);
    }
    let connects = t.counts().connects;
    tally.check("one connection carried the six publishes", connects == 4 && t.counts().reused >= 5);

    // Dropped after the PUBLISH reached the broker: may have landed, resent with the same key
    // on a new connection (the host checks the key reached the broker twice).
    let a = publish(&mut t, device, 6).await;
    tally.check(
        "mqtt_drop_before_puback_is_resent_with_its_key: Reset, retry",
        a == Err(Failure::Reset) && class(&a) == Class::Retry,
    );
    let a = publish(&mut t, device, 6).await;
    tally.check(
        "mqtt_drop_before_puback_is_resent_with_its_key: the resend lands on a new connection",
        status(&a) == Some(200) && t.counts().connects == connects + 1,
    );

    // DISCONNECTs after the PUBLISH: each ends the connection, and the runner's backoff paces
    // the next connect (the next attempt opens a new one).
    let before = t.counts().connects;
    let cases = [(7, 503, "0x89"), (8, 503, "0x9C"), (9, 429, "0x97"), (10, 429, "0x9F")];
    for (n, want, code) in cases {
        let a = publish(&mut t, device, n).await;
        let mut name: heapless::String<80> = heapless::String::new();
        let _ = core::fmt::Write::write_fmt(
            &mut name,
            format_args!("mqtt_disconnects_pace_the_reconnect: DISCONNECT {code} is {want}, retry"),
        );
        tally.check(&name, status(&a) == Some(want) && class(&a) == Class::Retry);
    }
    // The next reading opens a new connection and lands: one connect per kick after the first.
    let a = publish(&mut t, device, 11).await;
    tally.check(
        "mqtt_disconnects_pace_the_reconnect: a new connection after each kick",
        status(&a) == Some(200) && t.counts().connects == before + 4,
    );
    // A kick between readings: the broker's PUBACK, then its DISCONNECT 0x89 on the kept
    // connection. The next attempt's `open` reads it and fails (never sent: 503, retry); the
    // attempt after connects again and lands.
    let a = publish(&mut t, device, 12).await;
    tally.check("a reading lands before the kick", status(&a) == Some(200));
    // Time for the DISCONNECT to arrive; the check is what `open` makes of it.
    embassy_time::Timer::after_millis(200).await;
    let before = t.counts().connects;
    let kicked = t.open(LIMIT).await;
    tally.check(
        "mqtt_kick_on_a_kept_connection: open reads DISCONNECT 0x89 and fails with 503, retry",
        kicked == Err(Failure::status(503))
            && POLICY.classify(Operation::KeyedWrite, &kicked.err().unwrap_or(Failure::Reset).into())
                == Class::Retry,
    );
    let a = publish(&mut t, device, 13).await;
    tally.check(
        "mqtt_kick_on_a_kept_connection: the next attempt connects again and lands",
        status(&a) == Some(200) && t.counts().connects == before + 1,
    );
    // The broker's Server Keep Alive (10 s, under the device's 60) is the one in force: a kept
    // connection idle past three quarters of it is pinged before it carries the next reading,
    // and the reading goes on that connection.
    let m = t.mqtt_counts();
    tally.check("mqtt_server_keep_alive: the CONNACK's Server Keep Alive is in force", m.keep_alive == 10);
    embassy_time::Timer::after_millis(7_700).await;
    let before = t.counts().connects;
    let a = publish(&mut t, device, 14).await;
    let m = t.mqtt_counts();
    tally.check(
        "mqtt_server_keep_alive: an idle kept connection is pinged, then carries the reading",
        status(&a) == Some(200) && m.pings == 1 && t.counts().connects == before,
    );
    tally.check("five DISCONNECTs seen", m.disconnects == 5);
    m.log();
    t.close().await;
    tally.finish()
}

//! On-target checks of the CoAP transport (`wary_uplink::coap`, feature `coap`), one or more per
//! row of its outcome table (firmware/README.md): how each answer a CoAP server can give becomes
//! the seam's answer and the CoAP policy's class; the request's bytes (RFC 7252 section 3); the
//! message IDs and tokens across boots; and which datagrams answer an exchange. The transport's
//! live behaviour (a retransmission with the same message ID, answers from a server we did not
//! write) is checked by `cargo xtask device coap` and `coap-storm`.

#![no_std]
#![no_main]

use embassy_executor::Spawner;
use wary::{Class, Duration, Failure, Operation, Outcome};
use wary_qemu::Tally;
use wary_uplink::coap::{
    self, Ids, POLICY, Seen, TOKEN_LEN, encode_empty_ack, encode_post, header, judge, reply,
};
use wary_uplink::transport::{Answer, outcome};

const KEY: &str = "574152590a3860010000000100000000";
const TOKEN: [u8; TOKEN_LEN] = [0, 0, 0, 1, 0, 0, 0, 9];

/// The outcome and the policy's class of `answer` for a keyed write and an unkeyed one.
fn classes(answer: &Answer) -> (Outcome, Class, Class) {
    let (o, _) = outcome(answer, POLICY.retry_after_rules());
    (o, POLICY.classify(Operation::KeyedWrite, &o), POLICY.classify(Operation::Write, &o))
}

/// A piggybacked response (ACK, message ID 0x1009, [`TOKEN`]) with `code` and, if given, a
/// one-byte Max-Age, as a server writes it.
fn piggybacked(code: u8, max_age: Option<u8>, out: &mut [u8; 16]) -> &[u8] {
    out[..4].copy_from_slice(&[0x68, code, 0x10, 0x09]);
    out[4..12].copy_from_slice(&TOKEN);
    match max_age {
        // Option 14 (Max-Age): delta 13 + 1, length 1.
        Some(secs) => {
            out[12..15].copy_from_slice(&[0xd1, 1, secs]);
            &out[..15]
        }
        None => &out[..12],
    }
}

#[embassy_executor::main]
async fn main(_spawner: Spawner) {
    let _board = mps2_an386::init();
    let mut tally = Tally::new();

    // Row: 2.xx lands.
    let (o, keyed, _) = classes(&Ok(reply(wary::coap::code(2, 1), None)));
    tally.check("2.01: status 201, landed", o == Outcome::Ok && keyed == Class::Ok);
    let (o, _, _) = classes(&Ok(reply(wary::coap::code(2, 4), Some(60))));
    tally.check("2.04 with Max-Age: landed, the Max-Age (a cache lifetime) not kept", o == Outcome::Ok);

    // Row: 4.29 and 5.03 with Max-Age: a Retry-After.
    let r = reply(wary::coap::code(5, 3), Some(7));
    tally.check(
        "5.03 Max-Age 7: status 503 and a Retry-After of \"7\"",
        r.status == 503
            && r.retry_after.len() == 1
            && r.retry_after.first().map(|v| v.as_slice()) == Some(b"7".as_slice()),
    );
    let (o, keyed, unkeyed) = classes(&Ok(r));
    tally.check(
        "5.03 Max-Age 7: retried after 7 s (keyed), unknown (unkeyed)",
        o.retry_after() == Some(Duration::from_secs(7)) && keyed == Class::Retry && unkeyed == Class::Unknown,
    );
    let (o, keyed, unkeyed) = classes(&Ok(reply(wary::coap::code(4, 29), Some(120))));
    tally.check(
        "4.29 Max-Age 120: status 429, retried after 120 s, any operation",
        o.code() == Some(429)
            && o.retry_after() == Some(Duration::from_secs(120))
            && keyed == Class::Retry
            && unkeyed == Class::Retry,
    );
    let big = reply(wary::coap::code(5, 3), Some(u32::MAX));
    tally.check(
        "5.03 Max-Age 2^32-1: all ten digits kept",
        big.retry_after.first().map(|v| v.as_slice()) == Some(b"4294967295".as_slice()),
    );

    // Row: 4.29 and 5.03 without Max-Age: the backoff decides.
    let (o, keyed, _) = classes(&Ok(reply(wary::coap::code(5, 3), None)));
    tally.check(
        "5.03 without Max-Age: retried, no wait asked",
        o.retry_after().is_none() && keyed == Class::Retry,
    );

    // Row: any other 4.xx fails.
    let mut every = true;
    for detail in [0u8, 1, 2, 3, 4, 5, 6, 12, 13, 15] {
        let (o, keyed, unkeyed) = classes(&Ok(reply(wary::coap::code(4, detail), Some(5))));
        every &= keyed == Class::Failed && unkeyed == Class::Failed && o.retry_after().is_none();
    }
    tally.check("4.00 to 4.15: failed, Max-Age ignored", every);

    // Row: Reset: not processed, retried.
    let rst = [0x70, 0, 0x10, 0x09];
    let seen = judge(&rst, 0x1009, &TOKEN);
    tally.check("Reset of the exchange's message ID: refused", seen == Seen::Answer(Err(Failure::Refused)));
    let (_, keyed, unkeyed) = classes(&Err(Failure::Refused));
    tally.check("Reset: retried, keyed or not", keyed == Class::Retry && unkeyed == Class::Retry);
    tally.check(
        "Reset of another message ID: not this exchange's",
        judge(&rst, 0x100a, &TOKEN) == Seen::Other,
    );

    // Row: no ACK within the limit: may have landed.
    let (_, keyed, unkeyed) = classes(&Err(Failure::ResponseTimeout));
    tally.check(
        "no ACK: keyed retransmitted, unkeyed unknown",
        keyed == Class::Retry && unkeyed == Class::Unknown,
    );

    // Row: the request does not fit: our own bug.
    let mut small = [0u8; 40];
    tally.check(
        "a request larger than the buffer is not encoded",
        encode_post(&mut small, 1, &TOKEN, coap::PREFIX, KEY, &[b'x'; 64]).is_none(),
    );
    let (_, keyed, _) = classes(&Err(Failure::BadBody));
    tally.check("bad body: failed", keyed == Class::Failed);

    // Which datagrams answer the exchange.
    let mut buf = [0u8; 16];
    let ok = piggybacked(wary::coap::code(2, 1), None, &mut buf);
    tally.check(
        "piggybacked 2.01 with the message ID and token: the answer",
        matches!(judge(ok, 0x1009, &TOKEN), Seen::Answer(Ok(ref r)) if r.status == 201),
    );
    let mut other = TOKEN;
    other[7] = 8;
    tally.check(
        "a response with an ended exchange's token (a duplicate): not this exchange's",
        judge(ok, 0x1009, &other) == Seen::Other,
    );
    tally.check(
        "a piggybacked response of another message ID: not this exchange's",
        judge(ok, 0x1008, &TOKEN) == Seen::Other,
    );
    let mut buf = [0u8; 16];
    let unavailable = piggybacked(wary::coap::code(5, 3), Some(9), &mut buf);
    tally.check(
        "piggybacked 5.03 with Max-Age 9 read from the option",
        matches!(judge(unavailable, 0x1009, &TOKEN), Seen::Answer(Ok(ref r)) if r.status == 503 && r.retry_after.first().map(|v| v.as_slice()) == Some(b"9".as_slice())),
    );
    tally.check(
        "an empty ACK: the response follows",
        judge(&[0x60, 0, 0x10, 0x09], 0x1009, &TOKEN) == Seen::EmptyAck,
    );
    let mut separate = [0u8; 12];
    separate[..4].copy_from_slice(&[0x48, wary::coap::code(2, 4), 0x77, 0x01]);
    separate[4..].copy_from_slice(&TOKEN);
    tally.check(
        "a confirmable separate response with the token: the answer, to acknowledge with its own ID",
        matches!(judge(&separate, 0x1009, &TOKEN), Seen::Confirmable(Ok(ref r), 0x7701) if r.status == 204),
    );
    tally.check(
        "not CoAP version 1: nothing",
        judge(&[0x88, 0x41, 0x10, 0x09], 0x1009, &TOKEN) == Seen::Other,
    );

    // The request's bytes.
    let mut out = [0u8; coap::DATAGRAM];
    let body = br#"{"t":21000}"#;
    let n = encode_post(&mut out, 0x1009, &TOKEN, coap::PREFIX, KEY, body).unwrap_or(0);
    let d = out.get(..n).unwrap_or(&[]);
    let h = header(d);
    tally.check(
        "POST: version 1, CON, token length 8, code 0.02, message ID, token",
        h.is_some_and(|h| h.kind == 0 && h.code == 2 && h.id == 0x1009 && h.token_len == 8)
            && d.get(4..12) == Some(TOKEN.as_slice()),
    );
    // Uri-Path "r" (11, 1 byte), Uri-Path key (delta 0, 32 bytes: 13 + 19), Content-Format 50
    // (delta 1, 1 byte), then the payload marker and the body.
    let mut expected = heapless::Vec::<u8, 128>::new();
    let _ = expected.extend_from_slice(&[0xb1, b'r', 0x0d, 19]);
    let _ = expected.extend_from_slice(KEY.as_bytes());
    let _ = expected.extend_from_slice(&[0x11, 50, 0xff]);
    let _ = expected.extend_from_slice(body);
    tally.check("POST: /r/<key>, Content-Format 50, the body", d.get(12..) == Some(expected.as_slice()));
    let mut ack = [0u8; 4];
    tally.check(
        "empty ACK: 0x60 0.00 and the message ID",
        encode_empty_ack(&mut ack, 0x7701) == Some(4) && ack == [0x60, 0, 0x77, 0x01],
    );

    // Message IDs and tokens across boots.
    let mut boot1 = Ids::new(1);
    let mut boot2 = Ids::new(2);
    let (a, ta) = boot1.next_exchange();
    let (b, tb) = boot1.next_exchange();
    let (c, tc) = boot2.next_exchange();
    tally.check(
        "ids: boot 1's first two exchanges and boot 2's first differ in message ID and token",
        a != b && a != c && b != c && ta != tb && ta != tc && tb != tc,
    );
    tally.check(
        "ids: token = boot and count, big-endian; message ID's top 4 bits the boot's low 4",
        ta == [0, 0, 0, 1, 0, 0, 0, 0] && tc == [0, 0, 0, 2, 0, 0, 0, 0] && a == 0x1000 && c == 0x2000,
    );
    let mut every = true;
    let mut ids = Ids::new(3);
    let mut last = None;
    for _ in 0..4096 {
        let (id, _) = ids.next_exchange();
        every &= id >> 12 == 3 && last != Some(id);
        last = Some(id);
    }
    tally.check("ids: 4,096 exchanges of a boot stay in its message-ID range, none repeated in a row", every);

    tally.finish()
}

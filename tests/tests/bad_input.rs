//! The bad-input matrix: every way a setting or an input can be wrong, and the typed error it
//! gets. Bad configuration is refused when the policy is built, bad input when it is read; nothing
//! here panics or is discovered mid-call.
//!
//! | # | input | where | expected |
//! |---|---|---|---|
//! | 1 | base 0 | `PolicyBuilder::build` | `PolicyError::ZeroBase` |
//! | 2 | cap below base | `PolicyBuilder::build` | `PolicyError::CapBelowBase` |
//! | 3 | budget 0 | `PolicyBuilder::build` | `PolicyError::ZeroBudget` |
//! | 4 | deadline 0 | `PolicyBuilder::build` | `PolicyError::ZeroDeadline` |
//! | 5 | attempt cap 0 | `PolicyBuilder::build` | `PolicyError::ZeroAttempts` |
//! | 6 | tick rate 0 | `PolicyBuilder::build` | `PolicyError::ZeroTickRate` |
//! | 7 | a duration above 2⁴⁸ ticks | `PolicyBuilder::build` | `PolicyError::TooLarge` |
//! | 8 | full jitter (or a 1-tick cap) with no attempt cap | `PolicyBuilder::build` | `PolicyError::Unbounded` |
//! | 9 | status below 100 in a table | `Table::with_status` | `PolicyError::BadStatus` |
//! | 10 | status above 999 in a table | `Table::with_status` | `PolicyError::BadStatus` |
//! | 11 | a 13th status rule | `Table::with_status` | `PolicyError::TableFull` |
//! | 12 | fleet budget of 0 or over 1000 tokens, ratio 0 or over 1000 | `FleetBudget::new` | `PolicyError::BadFleetBudget` |
//! | 13 | empty or blank Retry-After | `retry_after::parse` | `RetryAfterError::Empty` |
//! | 14 | Retry-After neither seconds nor a date | `retry_after::parse` | `RetryAfterError::Malformed` |
//! | 15 | HTTP-date under integer-seconds rules | `Rules::read` | `RetryAfterError::DateNotAccepted` |
//! | 16 | two Retry-After headers under strict rules | `Rules::read` | `RetryAfterError::Duplicate` |
//! | 17 | HTTP-date with no Date header and no clock | `Rules::read` | `RetryAfterError::NoReference` |
//! | 18 | Retry-After of 10²⁶ seconds | `parse`, then `Policy::decide` | saturates; `GiveUp::RetryAfterTooLong { asked: u64::MAX }`, no wait |
//! | 19 | outcome status outside 100..=999 | `Policy::decide` | `Verdict::Failed`, no wait |
//! | 20 | percent draw of 100 or more | `Draw::percent` | `DrawError::OutOfRange` |
//! | 21 | fewer draws than retries | `plan::plan` | `PlanError::TooFewDraws { retry }` |
//! | 22 | more waits than the plan's capacity | `plan::plan` | `PlanError::CapacityExceeded { capacity }` |
//! | 23 | shortest attempt time longer than the deadline | `PolicyBuilder::build` | `PolicyError::AttemptPastDeadline` |
//! | 24 | `wary plan` line that is not JSON | `wary_cli::plan::answer` | `{"error": "invalid case: …"}` |
//! | 25 | `wary plan` unknown op | `wary_cli::plan::answer` | `{"error": "unknown op …"}` |
//! | 26 | `wary plan` draw outside 0..=99 | `wary_cli::plan::answer` | `{"error": "draw … is outside 0..=99"}` |
//! | 27 | `wary plan` too few draws | `wary_cli::plan::answer` | `{"error": "too few draws: retry n has none"}` |
//! | 28 | `wary plan` more outcomes than the capacity (64) | `wary_cli::plan::answer` | `{"error": "… more than the capacity of 64"}` |
//! | 29 | `wary plan` status not a three-digit HTTP status | `wary_cli::plan::answer` | `{"error": "status … is not a three-digit HTTP status"}` |
//! | 30 | `wary plan` invalid policy | `wary_cli::plan::answer` | `{"error": "invalid policy: …"}` |
//! | 31 | a modem line longer than the chat's buffer | `wary_dial::Chat::dial` (`crates/wary-dial/tests/scripted_modem.rs`: `overlong_line_is_dropped_and_counted`) | dropped and counted, the chat goes on |
//! | 32 | binary garbage from the modem | `wary_dial::Chat::dial` (`garbage_and_unsolicited_noise_are_skipped`, `endless_garbage_is_bounded_by_the_deadline`) | skipped as noise, bounded by the step's deadline |
//! | 33 | a reply whose status line is not HTTP | `wary_uplink::http::post` (on target: `nettest` `/garbage`) | `HttpError::Malformed` → `Outcome::Reset` (may have landed) |
//! | 34 | a reply cut short in its header block | `wary_uplink::http::post` (`nettest` `/truncated`) | `HttpError::Truncated` → `Outcome::Reset` (may have landed) |
//! | 35 | a connection refused | `wary_uplink::http::post` (`nettest` `/refused`) | `HttpError::Refused` → `Outcome::Refused` (never sent) |
//! | 36 | a reply that never comes (stalled) | `wary_uplink::http::post` (`nettest` `/stall`, `/trickle`) | `HttpError::ResponseTimeout` → `Outcome::ResponseTimeout` (may have landed) |
//! | 37 | gateway request body longer than its limit | `wary_gateway::ingress::parse` | `BadRequest::TooLarge`: 413, body not read, nothing sent upstream |
//! | 38 | gateway request body that is not JSON, or no `Idempotency-Key` | `wary_gateway::ingress::parse` | `BadRequest::NotJson` / `MissingKey`: 400 with the reason |
//! | 39 | gateway request cut short inside its body | `wary_gateway::ingress::parse` | `BadRequest::Broken`: nothing queued, nothing sent upstream |
//! | 40 | a reply header block larger than the device's buffer | `wary_uplink::http::post` (`nettest` `/huge-headers`) | `HttpError::HeadersTooLarge` → `Outcome::Reset` (may have landed) |

use wary::classify::TABLE_STATUSES;
use wary::policy::MAX_TICKS;
use wary::retry_after::{RetryAfter, RetryAfterError, Rules, parse};
use wary::{
    CallState, Decision, Draw, DrawError, FleetBudget, GiveUp, Jitter, Operation, Outcome, PlanError, Policy,
    PolicyBuilder, PolicyError, Preset, Rule, Table, Verdict, plan::plan,
};

/// A valid starting point, so each row changes exactly one setting.
fn exercise() -> PolicyBuilder {
    Policy::builder(Preset::Exercise).tick_hz(1).base(2).cap(60).budget(120)
}

const DATE: &[u8] = b"Sun, 06 Nov 1994 08:49:37 GMT";

#[test]
fn the_starting_point_is_valid() {
    assert!(exercise().build().is_ok());
}

#[test]
fn row_01_zero_base() {
    assert_eq!(exercise().base(0).build(), Err(PolicyError::ZeroBase));
}

#[test]
fn row_02_cap_below_base() {
    assert_eq!(exercise().base(10).cap(9).build(), Err(PolicyError::CapBelowBase));
}

#[test]
fn row_03_zero_budget() {
    assert_eq!(exercise().budget(0).build(), Err(PolicyError::ZeroBudget));
}

#[test]
fn row_04_zero_deadline() {
    assert_eq!(exercise().deadline(0).build(), Err(PolicyError::ZeroDeadline));
}

#[test]
fn row_05_zero_attempts() {
    assert_eq!(exercise().max_attempts(0).build(), Err(PolicyError::ZeroAttempts));
}

#[test]
fn row_06_zero_tick_rate() {
    assert_eq!(exercise().tick_hz(0).build(), Err(PolicyError::ZeroTickRate));
}

#[test]
fn row_07_too_large() {
    for b in [
        exercise().cap(MAX_TICKS + 1),
        exercise().budget(MAX_TICKS + 1),
        exercise().deadline(MAX_TICKS + 1),
        exercise().min_attempt(MAX_TICKS + 1),
        exercise().max_retry_after(MAX_TICKS + 1),
        exercise().budget(u64::MAX),
    ] {
        assert_eq!(b.build(), Err(PolicyError::TooLarge));
    }
    // The limit itself is accepted.
    assert!(exercise().budget(MAX_TICKS).build().is_ok());
}

#[test]
fn row_08_unbounded_full_jitter() {
    assert_eq!(exercise().jitter(Jitter::Full).build(), Err(PolicyError::Unbounded));
    // Equal jitter with a 1-tick ceiling draws waits of 0 too.
    assert_eq!(exercise().base(1).cap(1).build(), Err(PolicyError::Unbounded));
    // An attempt cap bounds them.
    assert!(exercise().jitter(Jitter::Full).max_attempts(4).build().is_ok());
}

#[test]
fn row_09_status_below_range_in_a_table() {
    for code in [0, 99] {
        assert_eq!(Table::DEFAULT.with_status(code, Rule::RetryAny), Err(PolicyError::BadStatus));
    }
    assert!(Table::DEFAULT.with_status(100, Rule::Fail).is_ok());
}

#[test]
fn row_10_status_above_range_in_a_table() {
    for code in [1000, u16::MAX] {
        assert_eq!(Table::DEFAULT.with_status(code, Rule::RetryAny), Err(PolicyError::BadStatus));
    }
    assert!(Table::DEFAULT.with_status(999, Rule::Fail).is_ok());
}

#[test]
fn row_11_table_full() {
    // The exercise table uses one slot, so every other slot can be filled.
    let mut t = Table::EXERCISE;
    for code in (600u16..).take(TABLE_STATUSES - 1) {
        t = t.with_status(code, Rule::Fail).unwrap();
    }
    assert_eq!(t.with_status(999, Rule::Fail), Err(PolicyError::TableFull));
    // Replacing a rule already there needs no free slot.
    assert!(t.with_status(600, Rule::RetryAny).is_ok());
}

#[test]
fn row_12_bad_fleet_budget() {
    for (tokens, ratio) in [(0, 100), (1001, 100), (10, 0), (10, 1001), (u32::MAX, u32::MAX)] {
        assert_eq!(
            FleetBudget::new(tokens, ratio).err(),
            Some(PolicyError::BadFleetBudget),
            "{tokens} {ratio}"
        );
    }
    assert!(FleetBudget::new(1000, 1000).is_ok());
}

#[test]
fn row_13_retry_after_empty() {
    for v in [&b""[..], b" ", b"\t \t"] {
        assert_eq!(parse(v), Err(RetryAfterError::Empty), "{v:?}");
    }
    assert_eq!(Rules::LENIENT.read([b"".as_slice()], None, None), Err(RetryAfterError::Empty));
}

#[test]
fn row_14_retry_after_malformed() {
    for v in
        [&b"soon"[..], b"-1", b"+5", b"1.5", b"1e3", b"12 34", b"\xff\xfe", b"Sun, 06 Nov 1994 08:49:37 UTC"]
    {
        assert_eq!(parse(v), Err(RetryAfterError::Malformed), "{v:?}");
    }
    // Lenient rules read a number outside the grammar as the longest wait it can mean, and
    // ignore, but count, what is no number at all; strict rules refuse both.
    for (v, secs) in [(&b"+5"[..], 5), (b"1.5", 2), (b"1e3", 1000)] {
        assert_eq!(Rules::LENIENT.read([v], None, None), Ok(Some(secs)), "{v:?}");
        assert_eq!(Rules::STRICT.read([v], None, None), Err(RetryAfterError::Malformed), "{v:?}");
    }
    for v in [&b"soon"[..], b"-1", b"12 34", b"\xff\xfe"] {
        let r = Rules::LENIENT.read_counted([v, b"3"], None, None);
        assert_eq!((r.seconds, r.unreadable), (Some(3), 1), "{v:?}");
    }
}

#[test]
fn row_15_retry_after_date_not_accepted() {
    assert_eq!(Rules::STRICT.read([DATE], Some(DATE), Some(0)), Err(RetryAfterError::DateNotAccepted));
    // The strict preset carries those rules.
    let strict = Policy::builder(Preset::Strict).build().unwrap();
    assert_eq!(
        strict.retry_after_rules().read([DATE], Some(DATE), None),
        Err(RetryAfterError::DateNotAccepted)
    );
}

#[test]
fn row_16_retry_after_duplicate() {
    assert_eq!(Rules::STRICT.read([b"1".as_slice(), b"1"], None, None), Err(RetryAfterError::Duplicate));
    // Lenient rules take the longest instead.
    assert_eq!(Rules::LENIENT.read([b"1".as_slice(), b"7", b"3"], None, None), Ok(Some(7)));
}

#[test]
fn row_17_retry_after_date_without_reference() {
    assert_eq!(Rules::LENIENT.read([DATE], None, None), Err(RetryAfterError::NoReference));
    // A Date header that cannot be read is no reference either.
    assert_eq!(Rules::LENIENT.read([DATE], Some(b"yesterday"), None), Err(RetryAfterError::NoReference));
}

#[test]
fn row_18_huge_retry_after_gives_up_now() {
    let huge = b"99999999999999999999999999";
    assert_eq!(parse(huge), Ok(RetryAfter::Seconds(u64::MAX)));
    let secs = Rules::LENIENT.read([huge.as_slice()], None, None).unwrap().unwrap();
    for preset in [Preset::Default, Preset::Exercise, Preset::Strict] {
        let p = Policy::builder(preset).build().unwrap();
        let mut s = CallState::new();
        let d = p.decide(&mut s, Operation::Read, &Outcome::status_after(429, secs), Draw::ZERO, None);
        assert_eq!(
            d,
            Decision::Done(Verdict::GaveUp(GiveUp::RetryAfterTooLong { asked: u64::MAX })),
            "{preset:?}"
        );
        assert_eq!(s.waited(), 0);
    }
}

#[test]
fn row_19_outcome_status_out_of_range_fails_without_a_wait() {
    for preset in [Preset::Default, Preset::Exercise, Preset::Strict] {
        let p = Policy::builder(preset).build().unwrap();
        for code in [0, 99, 1000, u16::MAX] {
            let mut s = CallState::new();
            let d = p.decide(&mut s, Operation::Read, &Outcome::status_after(code, 1), Draw::ZERO, None);
            assert_eq!(d, Decision::Done(Verdict::Failed), "{preset:?} {code}");
        }
    }
}

#[test]
fn row_20_draw_out_of_range() {
    for p in [100, 101, u8::MAX] {
        assert_eq!(Draw::percent(p), Err(DrawError::OutOfRange), "{p}");
    }
    assert!(Draw::percent(99).is_ok());
}

#[test]
fn row_21_too_few_draws() {
    let p = exercise().build().unwrap();
    let o = [Outcome::status(503); 5];
    let two = [Draw::ZERO; 2];
    assert_eq!(plan::<8>(&p, Operation::Read, &o, &two), Err(PlanError::TooFewDraws { retry: 3 }));
    assert_eq!(plan::<8>(&p, Operation::Read, &o, &[]), Err(PlanError::TooFewDraws { retry: 1 }));
    // A call that ends before it needs the missing draw is fine.
    let ends = [Outcome::status(503), Outcome::Ok];
    assert!(plan::<8>(&p, Operation::Read, &ends, &[Draw::ZERO]).is_ok());
}

#[test]
fn row_22_capacity_exceeded() {
    let p = exercise().build().unwrap();
    let o = [Outcome::status(503); 10];
    let draws = [Draw::ZERO; 9];
    assert_eq!(plan::<3>(&p, Operation::Read, &o, &draws), Err(PlanError::CapacityExceeded { capacity: 3 }));
    // Seven retries at most under the exercise policy: a capacity of 7 always holds them.
    assert!(plan::<7>(&p, Operation::Read, &o, &draws).is_ok());
}

#[test]
fn row_23_attempt_longer_than_the_deadline() {
    assert_eq!(exercise().deadline(10).min_attempt(11).build(), Err(PolicyError::AttemptPastDeadline));
    assert!(exercise().deadline(10).min_attempt(10).build().is_ok());
}

// ---- `wary plan` JSON lines: each gets `{"error": …}` and the run goes on ----

const P: &str = r#""policy":{"base":2,"cap":60,"budget":120}"#;

fn plan_error(line: &str) -> String {
    let e = wary_cli::plan::answer(line).expect_err(line);
    let v: serde_json::Value = serde_json::from_str(&wary_cli::plan::error_line(&e)).unwrap();
    v["error"].as_str().unwrap().to_owned()
}

#[test]
fn row_24_plan_line_not_json() {
    assert!(plan_error("{outcomes: [500]").starts_with("invalid case"));
}

#[test]
fn row_25_plan_unknown_op() {
    assert!(
        plan_error(&format!(r#"{{"outcomes":[500],"op":"upsert",{P},"draws":[]}}"#)).contains("unknown op")
    );
}

#[test]
fn row_26_plan_draw_out_of_range() {
    let e = plan_error(&format!(r#"{{"outcomes":[500,"ok"],"op":"read",{P},"draws":[100]}}"#));
    assert_eq!(e, "draw 100 is outside 0..=99");
}

#[test]
fn row_27_plan_too_few_draws() {
    let e = plan_error(&format!(r#"{{"outcomes":[500,500,"ok"],"op":"read",{P},"draws":[5]}}"#));
    assert_eq!(e, "too few draws: retry 2 has none");
}

#[test]
fn row_28_plan_more_outcomes_than_capacity() {
    let many = vec!["503"; wary_cli::plan::CAPACITY + 1].join(",");
    let e = plan_error(&format!(r#"{{"outcomes":[{many}],"op":"read",{P},"draws":[]}}"#));
    assert!(e.contains("more than the capacity of 64"), "{e}");
}

#[test]
fn row_29_plan_status_not_http() {
    let e = plan_error(&format!(r#"{{"outcomes":[1000],"op":"read",{P},"draws":[]}}"#));
    assert_eq!(e, "status 1000 is not a three-digit HTTP status");
}

#[test]
fn row_30_plan_policy_not_a_non_negative_integer() {
    for policy in [r#"{"base":5,"cap":-4,"budget":120}"#, r#"{"base":5,"cap":4.5,"budget":120}"#] {
        let e = plan_error(&format!(r#"{{"outcomes":["ok"],"op":"read","policy":{policy},"draws":[]}}"#));
        assert!(e.starts_with("invalid case"), "{e}");
    }
    // A cap below the base is not an error: every ceiling is the cap. The builder still
    // refuses it for a running call.
    let line = r#"{"outcomes":[503,"ok"],"op":"read","policy":{"base":5,"cap":4,"budget":120},"draws":[0]}"#;
    assert_eq!(wary_cli::plan::answer(line).unwrap(), r#"{"waits":[2],"verdict":"ok"}"#);
    assert_eq!(exercise().base(5).cap(4).build(), Err(PolicyError::CapBelowBase));
}

// ---- gateway requests ----

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wary_gateway::{BadRequest, Gateway};

/// Sends `raw` bytes to a gateway whose upstream is nowhere (nothing may reach it), half-closes
/// if `hang_up`, and returns the answer's bytes and the gateway's refusal count.
fn exchange(raw: &[u8], max_body: usize, hang_up: bool) -> (String, u64) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    rt.block_on(async {
        let mut c = wary_gateway::Config::new("http://127.0.0.1:9");
        c.max_body = max_body;
        let gw = std::sync::Arc::new(Gateway::start(c, Box::new(std::io::sink())).unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(wary_gateway::ingress::serve(gw.clone(), listener));
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(raw).await.unwrap();
        if hang_up {
            s.shutdown().await.unwrap();
        }
        let mut out = Vec::new();
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut out)).await;
        let m = gw.metrics();
        assert_eq!(m.stats.attempts(), 0, "nothing went upstream");
        (String::from_utf8_lossy(&out).into_owned(), m.refused.get("bad_request").copied().unwrap_or(0))
    })
}

fn head(len: usize, key: bool) -> String {
    let key = if key { "Idempotency-Key: 0123456789abcdef0123456789abcdef\r\n" } else { "" };
    format!(
        "POST /readings HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nConnection: close\r\n{key}Content-Length: {len}\r\n\r\n"
    )
}

#[test]
fn row_37_gateway_body_over_the_limit() {
    let body = format!("{{\"pad\":\"{}\"}}", "x".repeat(100));
    let (answer, refused) = exchange(format!("{}{body}", head(body.len(), true)).as_bytes(), 64, false);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains(&BadRequest::TooLarge.to_string()), "{answer}");
    assert_eq!(refused, 1);
}

#[test]
fn row_38_gateway_body_not_json_or_no_key() {
    let (answer, refused) = exchange(format!("{}seq=1", head(5, true)).as_bytes(), 1024, false);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains(&BadRequest::NotJson.to_string()), "{answer}");
    assert_eq!(refused, 1);
    let (answer, _) = exchange(format!("{}{{}}", head(2, false)).as_bytes(), 1024, false);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains(&BadRequest::MissingKey.to_string()), "{answer}");
}

#[test]
fn row_39_gateway_request_cut_short_in_its_body() {
    // 40 bytes announced, 10 sent, then the device hangs up: refused, never queued.
    let (answer, refused) = exchange(format!("{}{{\"seq\":12,", head(40, true)).as_bytes(), 1024, true);
    assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert_eq!(refused, 1, "the cut-short request was refused as broken");
}

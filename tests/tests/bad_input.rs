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
//! | 6 | a base shorter than a millisecond (a `core::time::Duration` of 500 µs) | `PolicyBuilder::build` | `PolicyError::ZeroBase` |
//! | 7 | a duration of `Duration::MAX` (4294967295 ms, what anything longer saturates to) | `PolicyBuilder::build` | `PolicyError::TooLarge` |
//! | 8 | full jitter (or a 1 ms cap) with no attempt cap | `PolicyBuilder::build` | `PolicyError::Unbounded` |
//! | 9 | exact status rule below 400 in a table | `Table::with_status` | `TableError::BadStatus` |
//! | 10 | exact status rule above 599 in a table | `Table::with_status` | `TableError::BadStatus` |
//! | 11 | a rule for every 4xx and 5xx status | `Table::with_status` | accepted: a table is never full |
//! | 12 | fleet budget of 0 or over 1000 tokens, ratio 0 or over 1000 | `FleetBudget::new` | `FleetBudgetError::Tokens` / `Ratio` |
//! | 13 | empty or blank Retry-After | `retry_after::parse` | `RetryAfterError::Empty` |
//! | 14 | Retry-After neither seconds nor a date | `retry_after::parse` | `RetryAfterError::Malformed` |
//! | 15 | HTTP-date under integer-seconds rules | `Rules::read` | `RetryAfterError::DateNotAccepted` |
//! | 16 | two Retry-After headers under strict rules | `Rules::read` | `RetryAfterError::Duplicate` |
//! | 17 | HTTP-date with no Date header and no clock | `Rules::read` | `RetryAfterError::NoReference` |
//! | 18 | Retry-After of 10²⁶ seconds | `Outcome::from_response`, then `Policy::decide` | saturates; `GiveUp::RetryAfterTooLong { asked: Duration::MAX }`, no wait |
//! | 19 | outcome status outside 100..=999 | `Policy::decide` | `Verdict::Failed`, no wait |
//! | 20 | percent draw of 100 or more | `Draw::percent` | `DrawError::OutOfRange` |
//! | 21 | fewer draws than retries | `plan` | `PlanError::TooFewDraws { retry }` |
//! | 22 | more waits than the plan's capacity | `plan` | `PlanError::CapacityExceeded { capacity }` |
//! | 23 | shortest attempt time longer than the deadline | `PolicyBuilder::build` | `PolicyError::AttemptPastDeadline` |
//! | 24 | `wary plan` line that is not JSON | `wary_cli::plan::answer` | `{"error": "invalid case: …"}` |
//! | 25 | `wary plan` unknown op | `wary_cli::plan::answer` | `{"error": "unknown op …"}` |
//! | 26 | `wary plan` draw outside 0..=99 | `wary_cli::plan::answer` | `{"error": "draw … is outside 0..=99"}` |
//! | 27 | `wary plan` too few draws | `wary_cli::plan::answer` | `{"error": "too few draws: retry n has none"}` |
//! | 28 | `wary plan` more outcomes than the capacity (64) | `wary_cli::plan::answer` | `{"error": "… more than the capacity of 64"}` |
//! | 29 | `wary plan` status not a three-digit HTTP status | `wary_cli::plan::answer` | `{"error": "status … is not a three-digit HTTP status"}` |
//! | 30 | `wary plan` policy number negative, fractional, or past 4294967294 | `wary_cli::plan::answer` | `{"error": "invalid case: …"}`, `{"error": "policy budget … is larger than wary counts (at most 4294967294)"}` |
//! | 31 | a modem line longer than the chat's buffer | `wary_dial::Chat::dial` (`crates/wary-dial/tests/scripted_modem.rs`: `overlong_line_is_dropped_and_counted`) | dropped and counted, the chat goes on |
//! | 32 | binary garbage from the modem | `wary_dial::Chat::dial` (`garbage_and_unsolicited_noise_are_skipped`, `endless_garbage_is_bounded_by_the_deadline`) | skipped as noise, bounded by the step's deadline |
//! | 33 | a reply whose status line is not HTTP | `wary_uplink::http::post` (on target: `nettest` `/garbage`) | `HttpError::Malformed` → `Outcome::Reset` (may have landed) |
//! | 34 | a reply cut short in its header block | `wary_uplink::http::post` (`nettest` `/truncated`) | `HttpError::Truncated` → `Outcome::Reset` (may have landed) |
//! | 35 | a connection refused | `wary_uplink::http::post` (`nettest` `/refused`) | `HttpError::Refused` → `Outcome::Refused` (never sent) |
//! | 36 | a reply that never comes (stalled) | `wary_uplink::http::post` (`nettest` `/stall`, `/trickle`) | `HttpError::ResponseTimeout` → `Outcome::ResponseTimeout` (may have landed) |
//! | 37 | gateway request body longer than its limit | `wary_gateway::ingress::serve` (`handle_as`: `key_of`, `read_body`) | `BadRequest::TooLarge`: 413, body not read, nothing sent upstream |
//! | 38 | gateway request body that is not JSON, or no `Idempotency-Key` | `wary_gateway::ingress::serve` (`handle_as`: `key_of`, `read_body`) | `BadRequest::NotJson` / `MissingKey`: 400 with the reason |
//! | 39 | gateway request cut short inside its body | `wary_gateway::ingress::serve` (`handle_as`: `key_of`, `read_body`) | `BadRequest::Broken`: nothing queued, nothing sent upstream |
//! | 40 | a reply header block larger than the device's buffer | `wary_uplink::http::post` (`nettest` `/huge-headers`) | `HttpError::HeadersTooLarge` → `Outcome::Reset` (may have landed) |

use wary::{
    CallState, Decision, Draw, DrawError, Duration, FleetBudget, FleetBudgetError, GiveUp, Jitter, Operation,
    Outcome, Policy, PolicyBuilder, PolicyError, Preset, Rule, Table, TableError, Verdict,
    plan::{PlanError, plan},
    retry_after::{RetryAfter, RetryAfterError, Rules, parse},
};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The longest duration a setting may have: one below [`Duration::MAX`].
const LONGEST: u64 = u32::MAX as u64 - 1;

/// A valid starting point, so each row changes exactly one setting.
fn basic() -> PolicyBuilder {
    Policy::builder(Preset::Basic).base(ms(2)).cap(ms(60)).budget(ms(120))
}

const DATE: &[u8] = b"Sun, 06 Nov 1994 08:49:37 GMT";

#[test]
fn the_starting_point_is_valid() {
    assert!(basic().build().is_ok());
}

#[test]
fn row_01_zero_base() {
    assert_eq!(basic().base(ms(0)).build(), Err(PolicyError::ZeroBase));
}

#[test]
fn row_02_cap_below_base() {
    assert_eq!(basic().base(ms(10)).cap(ms(9)).build(), Err(PolicyError::CapBelowBase));
}

#[test]
fn row_03_zero_budget() {
    assert_eq!(basic().budget(ms(0)).build(), Err(PolicyError::ZeroBudget));
}

#[test]
fn row_04_zero_deadline() {
    assert_eq!(basic().deadline(ms(0)).build(), Err(PolicyError::ZeroDeadline));
}

#[test]
fn row_05_zero_attempts() {
    assert_eq!(basic().max_attempts(0).build(), Err(PolicyError::ZeroAttempts));
}

#[test]
fn row_06_a_base_shorter_than_a_millisecond() {
    // The unit is the type's, not a rate set beside it: a std duration below a millisecond is no
    // time to wary, and a base of no time is refused, not run as a spin.
    let half = Duration::from(core::time::Duration::from_micros(500));
    assert_eq!(half, Duration::ZERO);
    assert_eq!(basic().base(half).build(), Err(PolicyError::ZeroBase));
    // Rounded up instead, it is a millisecond, and a base.
    assert!(basic().base(Duration::from_micros_ceil(500)).build().is_ok());
}

#[test]
fn row_07_too_large() {
    for b in [
        basic().cap(Duration::MAX),
        basic().budget(Duration::MAX),
        basic().deadline(Duration::MAX),
        basic().min_attempt(Duration::MAX),
        basic().max_retry_after(Duration::MAX),
        basic().budget(ms(LONGEST + 1)),
        // Anything longer saturates to the same.
        basic().budget(ms(u64::MAX)),
        basic().budget(Duration::from_secs(365 * 86_400)),
    ] {
        assert_eq!(b.build(), Err(PolicyError::TooLarge));
    }
    // The limit itself is accepted.
    assert!(basic().budget(ms(LONGEST)).build().is_ok());
}

#[test]
fn row_08_unbounded_full_jitter() {
    assert_eq!(basic().jitter(Jitter::Full).build(), Err(PolicyError::Unbounded));
    // Equal jitter with a 1 ms ceiling draws waits of 0 too.
    assert_eq!(basic().base(ms(1)).cap(ms(1)).build(), Err(PolicyError::Unbounded));
    // An attempt cap bounds them.
    assert!(basic().jitter(Jitter::Full).max_attempts(4).build().is_ok());
}

#[test]
fn row_09_exact_status_below_range_in_a_table() {
    // Exact rules are for 4xx and 5xx; any other status follows the table's other-status rule.
    for code in [0, 99, 100, 200, 399] {
        assert_eq!(Table::DEFAULT.with_status(code, Rule::RetryAny), Err(TableError::BadStatus), "{code}");
    }
    assert!(Table::DEFAULT.with_status(400, Rule::Fail).is_ok());
    let t = Table::DEFAULT.with_other_statuses(Rule::RetryAny);
    assert_eq!(t.status_rule(399), Rule::RetryAny);
}

#[test]
fn row_10_exact_status_above_range_in_a_table() {
    for code in [600, 999, 1000, u16::MAX] {
        assert_eq!(Table::DEFAULT.with_status(code, Rule::RetryAny), Err(TableError::BadStatus), "{code}");
    }
    assert!(Table::DEFAULT.with_status(599, Rule::Fail).is_ok());
}

#[test]
fn row_11_a_table_is_never_full() {
    // Every 4xx and 5xx status has its own rule: the two hundredth exact rule fits like the
    // first, and each reads back.
    let mut t = Table::BASIC;
    for code in 400u16..=599 {
        let rule = Rule::ALL[usize::from(code) % Rule::ALL.len()];
        t = t.with_status(code, rule).unwrap();
    }
    assert_eq!(t.exact_rules().count(), 200);
    for code in 400u16..=599 {
        assert_eq!(t.status_rule(code), Rule::ALL[usize::from(code) % Rule::ALL.len()], "{code}");
    }
    // Replacing a rule already there adds none.
    let t = t.with_status(429, Rule::Fail).unwrap();
    assert_eq!((t.exact_rules().count(), t.status_rule(429)), (200, Rule::Fail));
}

#[test]
fn row_12_bad_fleet_budget() {
    for (tokens, ratio, want) in [
        (0, 100, FleetBudgetError::Tokens),
        (1001, 100, FleetBudgetError::Tokens),
        (10, 0, FleetBudgetError::Ratio),
        (10, 1001, FleetBudgetError::Ratio),
        (u32::MAX, u32::MAX, FleetBudgetError::Tokens),
    ] {
        assert_eq!(FleetBudget::new(tokens, ratio).err(), Some(want), "{tokens} {ratio}");
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
    assert_eq!(Rules::LENIENT.read([huge.as_slice()], None, None), Ok(Some(u64::MAX)));
    for preset in [Preset::Default, Preset::Basic, Preset::Strict] {
        let p = Policy::builder(preset).build().unwrap();
        let (outcome, reading) =
            Outcome::from_response(429, [huge.as_slice()], None, None, p.retry_after_rules());
        assert_eq!((outcome.retry_after(), reading.unreadable), (Some(Duration::MAX), 0), "{preset:?}");
        let mut s = CallState::new();
        let d = p.decide(&mut s, Operation::Idempotent, &outcome, Draw::ZERO, None);
        assert_eq!(
            d,
            Decision::Done(Verdict::GaveUp(GiveUp::RetryAfterTooLong { asked: Duration::MAX })),
            "{preset:?}"
        );
        assert_eq!(s.waited(), Duration::ZERO);
    }
}

#[test]
fn row_19_outcome_status_out_of_range_fails_without_a_wait() {
    for preset in [Preset::Default, Preset::Basic, Preset::Strict] {
        let p = Policy::builder(preset).build().unwrap();
        for code in [0, 99, 1000, u16::MAX] {
            let mut s = CallState::new();
            let o = Outcome::status_after(code, Duration::from_secs(1));
            let d = p.decide(&mut s, Operation::Idempotent, &o, Draw::ZERO, None);
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
    let p = basic().build().unwrap();
    let o = [Outcome::status(503); 5];
    let two = [Draw::ZERO; 2];
    assert_eq!(plan::<8>(&p, Operation::Idempotent, &o, &two), Err(PlanError::TooFewDraws { retry: 3 }));
    assert_eq!(plan::<8>(&p, Operation::Idempotent, &o, &[]), Err(PlanError::TooFewDraws { retry: 1 }));
    // A call that ends before it needs the missing draw is fine.
    let ends = [Outcome::status(503), Outcome::Ok];
    assert!(plan::<8>(&p, Operation::Idempotent, &ends, &[Draw::ZERO]).is_ok());
}

#[test]
fn row_22_capacity_exceeded() {
    let p = basic().build().unwrap();
    let o = [Outcome::status(503); 10];
    let draws = [Draw::ZERO; 9];
    assert_eq!(
        plan::<3>(&p, Operation::Idempotent, &o, &draws),
        Err(PlanError::CapacityExceeded { capacity: 3 })
    );
    // Seven retries at most under the basic policy: a capacity of 7 always holds them.
    assert!(plan::<7>(&p, Operation::Idempotent, &o, &draws).is_ok());
}

#[test]
fn row_23_attempt_longer_than_the_deadline() {
    assert_eq!(basic().deadline(ms(10)).min_attempt(ms(11)).build(), Err(PolicyError::AttemptPastDeadline));
    assert!(basic().deadline(ms(10)).min_attempt(ms(10)).build().is_ok());
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
fn row_30_plan_policy_not_a_non_negative_integer_or_too_large() {
    for policy in [r#"{"base":5,"cap":-4,"budget":120}"#, r#"{"base":5,"cap":4.5,"budget":120}"#] {
        let e = plan_error(&format!(r#"{{"outcomes":["ok"],"op":"read","policy":{policy},"draws":[]}}"#));
        assert!(e.starts_with("invalid case"), "{e}");
    }
    // A cap below the base is not an error: every ceiling is the cap. The builder still
    // refuses it for a running call.
    let line = r#"{"outcomes":[503,"ok"],"op":"read","policy":{"base":5,"cap":4,"budget":120},"draws":[0]}"#;
    assert_eq!(wary_cli::plan::answer(line).unwrap(), r#"{"waits":[2],"verdict":"ok"}"#);
    assert_eq!(basic().base(ms(5)).cap(ms(4)).build(), Err(PolicyError::CapBelowBase));
    // A number past what wary counts is refused by name, with the limit; at the limit it is
    // answered.
    for (field, policy) in [
        ("base", r#"{"base":4294967295,"cap":60,"budget":120}"#),
        ("cap", r#"{"base":2,"cap":18446744073709551615,"budget":120}"#),
        ("budget", r#"{"base":2,"cap":60,"budget":4294967296}"#),
    ] {
        let e = plan_error(&format!(r#"{{"outcomes":["ok"],"op":"read","policy":{policy},"draws":[]}}"#));
        assert!(e.starts_with(&format!("policy {field} ")), "{e}");
        assert!(e.ends_with("is larger than wary counts (at most 4294967294)"), "{e}");
    }
    let line =
        r#"{"outcomes":[503,"ok"],"op":"read","policy":{"base":2,"cap":60,"budget":4294967294},"draws":[0]}"#;
    assert_eq!(wary_cli::plan::answer(line).unwrap(), r#"{"waits":[1],"verdict":"ok"}"#);
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
        c.auth = wary_gateway::Auth::Open;
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

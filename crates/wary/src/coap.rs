//! CoAP (RFC 7252): the transmission parameters, the classification of response codes, and the
//! policy that is a confirmable message's retransmission schedule.
//!
//! There is one retry layer. Each transmission of a CON is one attempt of a wary call, and the
//! waits between transmissions are the policy's: [`Preset::Coap`](crate::Preset::Coap) draws the
//! first timeout once in `[ACK_TIMEOUT, ACK_TIMEOUT × ACK_RANDOM_FACTOR]` and doubles it
//! ([`Jitter::Coap`](crate::Jitter::Coap)), stops after `MAX_RETRANSMIT` retransmissions, and
//! budgets `MAX_TRANSMIT_SPAN` of waiting, as section 4.8 of the RFC sets them. No CoAP stack
//! retransmits underneath.
//!
//! A response becomes an [`Outcome`] with [`outcome`]: 2.xx is success, 5.03 and 4.29 (RFC 8516)
//! carry their Max-Age as a Retry-After, and the codes become the HTTP statuses RFC 8075 maps
//! them to (4.04 is 404, 5.03 is 503), so ledgers and tables read them as they read HTTP.
//!
//! ```
//! use wary::{Class, Draw, Duration, Failure, Operation, Outcome, Policy, Preset, coap};
//! let p = Policy::builder(Preset::Coap).build().unwrap();
//! // 5.03 with Max-Age 7: retry a keyed write after 7 s.
//! let o = coap::outcome(coap::code(5, 3), Some(7));
//! assert_eq!((o.code(), o.retry_after()), (Some(503), Some(Duration::from_secs(7))));
//! assert_eq!(p.classify(Operation::KeyedWrite, &o), Class::Retry);
//! // No ACK: a keyed write retransmits, an unkeyed one ends unknown.
//! let lost = coap::unacknowledged();
//! assert_eq!(p.classify(Operation::KeyedWrite, &lost), Class::Retry);
//! assert_eq!(p.classify(Operation::Write, &lost), Class::Unknown);
//! assert_eq!(coap::Parameters::RFC7252.exchange_lifetime(), Duration::from_secs(247));
//! ```

use crate::classify::{Failure, Outcome, Rule, Table};
use crate::time::Duration;

/// ACK_RANDOM_FACTOR as a fraction: 3/2, the RFC's 1.5, which [`Jitter::Coap`](crate::Jitter::Coap)
/// draws under.
const RANDOM_FACTOR: (u32, u32) = (3, 2);

/// The transmission parameters of RFC 7252 section 4.8 that the derived times depend on, and the
/// times derived from them (section 4.8.2), in integer milliseconds, saturating.
///
/// ACK_RANDOM_FACTOR is the RFC's 1.5, the factor [`Jitter::Coap`](crate::Jitter::Coap) draws
/// under; it is not a setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Parameters {
    /// ACK_TIMEOUT: the shortest first timeout.
    pub ack_timeout: Duration,
    /// MAX_RETRANSMIT: retransmissions after the first transmission.
    pub max_retransmit: u32,
    /// MAX_LATENCY: the longest a datagram is taken to be in flight.
    pub max_latency: Duration,
    /// PROCESSING_DELAY: the longest a node takes to acknowledge a CON.
    pub processing_delay: Duration,
}

impl Parameters {
    /// The RFC's defaults: ACK_TIMEOUT 2 s, MAX_RETRANSMIT 4, MAX_LATENCY 100 s,
    /// PROCESSING_DELAY = ACK_TIMEOUT.
    pub const RFC7252: Parameters = Parameters {
        ack_timeout: Duration::from_secs(2),
        max_retransmit: 4,
        max_latency: Duration::from_secs(100),
        processing_delay: Duration::from_secs(2),
    };

    /// `ACK_TIMEOUT × (2^n − 1) × ACK_RANDOM_FACTOR`, saturating.
    const fn doubled_span(&self, n: u32) -> Duration {
        let (num, den) = RANDOM_FACTOR;
        let doublings = match 1u32.checked_shl(n) {
            Some(p) => p.saturating_sub(1),
            None => u32::MAX,
        };
        let ms = self.ack_timeout.as_millis().saturating_mul(doublings).saturating_mul(num);
        // Halving by the factor's denominator after the multiply keeps the result exact: the
        // RFC's figures are whole milliseconds. A product that saturated stays saturated.
        let ms = match ms.checked_div(den) {
            Some(v) if ms != u32::MAX => v,
            _ => u32::MAX,
        };
        Duration::from_millis(ms as u64)
    }

    /// MAX_TRANSMIT_SPAN: from the first transmission to the last retransmission, at most
    /// (45 s by default). The preset's wait budget.
    pub const fn max_transmit_span(&self) -> Duration {
        self.doubled_span(self.max_retransmit)
    }

    /// MAX_TRANSMIT_WAIT: from the first transmission until the sender gives up waiting for an
    /// acknowledgement, at most (93 s by default): the span, and the last timeout after it.
    pub const fn max_transmit_wait(&self) -> Duration {
        self.doubled_span(self.max_retransmit.saturating_add(1))
    }

    /// MAX_RTT: `2 × MAX_LATENCY + PROCESSING_DELAY` (202 s by default).
    pub const fn max_rtt(&self) -> Duration {
        self.max_latency.saturating_mul(2).saturating_add(self.processing_delay)
    }

    /// EXCHANGE_LIFETIME: `MAX_TRANSMIT_SPAN + 2 × MAX_LATENCY + PROCESSING_DELAY` (247 s by
    /// default): how long a message ID stays in use, and how long a server is expected to
    /// recognise it as a duplicate, if it has not restarted.
    pub const fn exchange_lifetime(&self) -> Duration {
        self.max_transmit_span().saturating_add(self.max_rtt())
    }

    /// NON_LIFETIME: `MAX_TRANSMIT_SPAN + MAX_LATENCY` (145 s by default).
    pub const fn non_lifetime(&self) -> Duration {
        self.max_transmit_span().saturating_add(self.max_latency)
    }

    /// The attempts of one exchange: the first transmission and MAX_RETRANSMIT more.
    pub const fn transmissions(&self) -> u32 {
        self.max_retransmit.saturating_add(1)
    }

    /// The ceiling of the last retransmission, `ACK_TIMEOUT × 2^(MAX_RETRANSMIT − 1)` (16 s by
    /// default): the cap the preset's backoff never passes within one exchange.
    pub const fn last_ceiling(&self) -> Duration {
        let shift = self.max_retransmit.saturating_sub(1);
        match 1u32.checked_shl(shift) {
            Some(p) => self.ack_timeout.saturating_mul(p),
            None => Duration::MAX,
        }
    }
}

/// The classification table of [`Preset::Coap`](crate::Preset::Coap), over the HTTP statuses
/// [`outcome`] maps response codes to:
///
/// - 4.29 (429) is retried for any operation: the server refused the request before doing it.
/// - 5.00, 5.02, 5.03 and 5.04 are retried for a read or a keyed write; an unkeyed write that
///   met them ends unknown (a proxy or the server may have done the work).
/// - Every other 4.xx and 5.xx fails (5.01 and 5.05 answer the same way every time).
/// - A CON with no acknowledgement ([`unacknowledged`]) may have landed: a keyed write is sent
///   again with its key, an unkeyed write ends unknown. Message-ID deduplication is a server's
///   SHOULD, kept for one exchange lifetime and lost when it restarts, so wary does not bet an
///   unkeyed write on it. A deployment that trusts its server's deduplication can move
///   [`Transport::ResponseTimeout`](crate::Transport::ResponseTimeout) to [`Rule::RetryAny`].
/// - A Reset ([`reset`]) retries any operation: the server did not process the message.
pub const TABLE: Table = {
    let t = Table::new(Rule::Fail, Rule::Fail, Rule::Fail);
    let t = match t.with_status(429, Rule::RetryAny) {
        Ok(t) => t,
        Err(_) => t,
    };
    let t = match t.with_status(500, Rule::RetryIdempotent) {
        Ok(t) => t,
        Err(_) => t,
    };
    let t = match t.with_status(502, Rule::RetryIdempotent) {
        Ok(t) => t,
        Err(_) => t,
    };
    let t = match t.with_status(503, Rule::RetryIdempotent) {
        Ok(t) => t,
        Err(_) => t,
    };
    match t.with_status(504, Rule::RetryIdempotent) {
        Ok(t) => t,
        Err(_) => t,
    }
};

/// A response code byte from its class and detail (`c.dd`: 3 bits and 5 bits, RFC 7252
/// section 3); each is masked to its width, and the two, disjoint, are added.
pub const fn code(class: u8, detail: u8) -> u8 {
    ((class & 0x07) << 5).wrapping_add(detail & 0x1f)
}

/// The HTTP status a response code maps to: `class × 100 + detail` (4.04 is 404, 5.03 is 503,
/// 4.29 is 429, as RFC 8075 maps them).
pub const fn status(code: u8) -> u16 {
    let class = (code >> 5) as u16;
    let detail = (code & 0x1f) as u16;
    // At most 7 × 100 + 31.
    class.saturating_mul(100).saturating_add(detail)
}

/// The outcome of a CoAP response with code byte `code` and Max-Age option `max_age` (seconds,
/// `None` if the response carried none).
///
/// - 2.xx is [`Outcome::Ok`].
/// - 5.03 and 4.29 with a Max-Age ask for that wait, as a Retry-After does (RFC 7252 section
///   5.9.3.4, RFC 8516).
/// - 5.03 and 4.29 without one ask for nothing, and the backoff decides. The option's default
///   of 60 s is a cache lifetime, not a server asking for a pause: read as one, every bare 5.03
///   would ask for more than one exchange may wait (MAX_TRANSMIT_SPAN, 45 s) and end the call at
///   once. A server that wants a pause says so, and HTTP's 503 without Retry-After is read the
///   same way.
/// - Any other code is a failed status, classified by the policy's table. Max-Age on other
///   codes is a cache lifetime and is ignored.
pub const fn outcome(code: u8, max_age: Option<u32>) -> Outcome {
    let status = status(code);
    if code >> 5 == 2 {
        return Outcome::Ok;
    }
    match (status, max_age) {
        (503 | 429, Some(secs)) => Outcome::status_after(status, Duration::from_secs(secs as u64)),
        _ => Outcome::status(status),
    }
}

/// The outcome of a transmission of a CON that no ACK (and no response) answered in time: it
/// may have landed ([`Failure::ResponseTimeout`]).
pub const fn unacknowledged() -> Outcome {
    Outcome::Failure(Failure::ResponseTimeout)
}

/// The outcome of a Reset answering a CON: the server received the message and did not process
/// it ([`Failure::Refused`]: nothing was done).
pub const fn reset() -> Outcome {
    Outcome::Failure(Failure::Refused)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::{CallState, Decision, GiveUp, Verdict};
    use crate::{Class, Draw, Jitter, Operation, Policy, Preset, plan::plan};

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn secs(waits: &[Duration]) -> Vec<u32> {
        waits.iter().map(|w| w.as_millis() / 1000).collect()
    }

    fn coap() -> Policy {
        Policy::builder(Preset::Coap).build().unwrap()
    }

    #[test]
    fn the_derived_times_are_the_rfcs() {
        let p = Parameters::RFC7252;
        // RFC 7252 section 4.8.2's table of derived parameters.
        assert_eq!(p.max_transmit_span(), s(45));
        assert_eq!(p.max_transmit_wait(), s(93));
        assert_eq!(p.max_rtt(), s(202));
        assert_eq!(p.exchange_lifetime(), s(247));
        assert_eq!(p.non_lifetime(), s(145));
        assert_eq!((p.transmissions(), p.last_ceiling()), (5, s(16)));
        // Other parameters follow the same formulas, exactly and saturating.
        let short = Parameters { ack_timeout: Duration::from_millis(500), max_retransmit: 2, ..p };
        assert_eq!(short.max_transmit_span(), Duration::from_millis(2_250));
        assert_eq!(short.max_transmit_wait(), Duration::from_millis(5_250));
        let huge = Parameters { max_retransmit: 40, ..p };
        assert_eq!((huge.max_transmit_span(), huge.last_ceiling()), (Duration::MAX, Duration::MAX));
    }

    #[test]
    fn the_preset_is_the_rfcs_schedule() {
        let p = coap();
        let params = Parameters::RFC7252;
        assert_eq!(p.backoff().jitter, Jitter::Coap);
        assert_eq!((p.backoff().base, p.backoff().cap), (params.ack_timeout, params.last_ceiling()));
        assert_eq!(
            (p.max_attempts(), p.budget()),
            (Some(params.transmissions()), params.max_transmit_span())
        );
        let lost = [unacknowledged(); 6];
        let op = Operation::KeyedWrite;
        // The lowest draw and the highest: 2, 4, 8, 16 s and 3, 6, 12, 24 s, then the exchange
        // is over after five transmissions.
        let low = plan::<8>(&p, op, &lost, &[Draw::ZERO; 5]).unwrap();
        assert_eq!(secs(&low.waits), [2, 4, 8, 16]);
        assert_eq!(low.verdict, Verdict::GaveUp(GiveUp::Attempts));
        let high = plan::<8>(&p, op, &lost, &[Draw::TOP; 5]).unwrap();
        assert_eq!(secs(&high.waits), [3, 6, 12, 24]);
        assert_eq!(high.waits.iter().map(|w| w.as_millis()).sum::<u32>(), 45_000);
        // The draw is taken once per call: the first retry's, whatever follows it.
        let once =
            plan::<8>(&p, op, &lost, &[Draw::TOP, Draw::ZERO, Draw::ZERO, Draw::ZERO, Draw::ZERO]).unwrap();
        assert_eq!(once.waits, high.waits);
        // The decision itself gives the same schedule from the same first draw.
        let mut state = CallState::new();
        let mut waits = Vec::new();
        for d in [Draw::TOP, Draw::ZERO, Draw::TOP, Draw::ZERO] {
            match p.decide(&mut state, op, &unacknowledged(), d, None) {
                Decision::Retry { wait } => waits.push(wait),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(waits, high.waits.as_slice());
        // The most retries: MAX_RETRANSMIT.
        assert_eq!(p.max_retries(), Some(4));
    }

    #[test]
    fn response_codes_become_outcomes() {
        let p = coap();
        let (keyed, write) = (Operation::KeyedWrite, Operation::Write);
        // 2.xx: landed.
        for detail in [1, 2, 3, 4, 5, 31] {
            assert_eq!(outcome(code(2, detail), None), Outcome::Ok, "2.{detail:02}");
        }
        // 5.03 and 4.29 with Max-Age: a Retry-After.
        assert_eq!(outcome(code(5, 3), Some(30)), Outcome::status_after(503, s(30)));
        assert_eq!(outcome(code(4, 29), Some(5)), Outcome::status_after(429, s(5)));
        assert_eq!(outcome(code(4, 29), Some(u32::MAX)).retry_after(), Some(s(u64::from(u32::MAX))));
        // Without Max-Age: no ask.
        assert_eq!(outcome(code(5, 3), None), Outcome::status(503));
        assert_eq!(outcome(code(4, 29), None), Outcome::status(429));
        // Max-Age on any other code is a cache lifetime.
        assert_eq!(outcome(code(4, 4), Some(60)), Outcome::status(404));
        assert_eq!(outcome(code(5, 0), Some(60)), Outcome::status(500));
        // 4.29 retries any operation; 5.03 a keyed write, an unkeyed one is unknown.
        assert_eq!(p.classify(write, &outcome(code(4, 29), Some(5))), Class::Retry);
        assert_eq!(p.classify(keyed, &outcome(code(5, 3), Some(5))), Class::Retry);
        assert_eq!(p.classify(write, &outcome(code(5, 3), Some(5))), Class::Unknown);
        for detail in [0, 2, 4] {
            assert_eq!(p.classify(keyed, &outcome(code(5, detail), None)), Class::Retry, "5.{detail:02}");
        }
        for detail in [1, 5] {
            assert_eq!(p.classify(keyed, &outcome(code(5, detail), None)), Class::Failed, "5.{detail:02}");
        }
        // Every other 4.xx fails, for every operation.
        for detail in (0..32).filter(|d| *d != 29) {
            for op in Operation::ALL {
                assert_eq!(p.classify(op, &outcome(code(4, detail), None)), Class::Failed, "4.{detail:02}");
            }
        }
        // Codes outside 2, 4 and 5 (a request code, signalling) are not successes.
        assert_eq!(p.classify(keyed, &outcome(code(0, 2), None)), Class::Failed);
        assert_eq!(p.classify(keyed, &outcome(code(7, 1), None)), Class::Failed);
        // No ACK: a keyed write resends, an unkeyed write ends unknown; a Reset retries any.
        assert_eq!(p.classify(keyed, &unacknowledged()), Class::Retry);
        assert_eq!(p.classify(write, &unacknowledged()), Class::Unknown);
        assert_eq!(p.classify(write, &reset()), Class::Retry);
        assert_eq!((status(code(4, 4)), status(code(2, 5)), status(0xff)), (404, 205, 731));
    }

    #[test]
    fn max_age_is_waited_exactly_and_a_long_one_ends_the_exchange_with_what_was_asked() {
        let p = coap();
        let op = Operation::KeyedWrite;
        let outcomes = [outcome(code(5, 3), Some(10)), outcome(code(2, 4), None)];
        let r = plan::<8>(&p, op, &outcomes, &[Draw::TOP]).unwrap();
        assert_eq!((secs(&r.waits), r.verdict), (vec![10], Verdict::Ok));
        // Shorter than the drawn timeout: the timeout wins.
        let r = plan::<8>(&p, op, &[outcome(code(4, 29), Some(1)), Outcome::Ok], &[Draw::TOP]).unwrap();
        assert_eq!(secs(&r.waits), [3]);
        // More than one exchange may wait: the call ends now, with the ask, for an outbox to keep.
        let r = plan::<8>(&p, op, &[outcome(code(5, 3), Some(60)), Outcome::Ok], &[Draw::ZERO]).unwrap();
        assert_eq!(r.verdict, Verdict::GaveUp(GiveUp::RetryAfterTooLong { asked: s(60) }));
    }
}

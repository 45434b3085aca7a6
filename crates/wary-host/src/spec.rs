//! A policy as data: every setting of a [`wary::Policy`], serialisable, so a ledger can carry
//! the policy it was made under and `wary explain` can read one from a file.

use serde::{Deserialize, Serialize};
use wary::retry_after::{Duplicates, Rules};
use wary::{Jitter, Policy, PolicyError, Preset, RetryAfterMode, Rule, Table};

use crate::ratelimit::Signals;

/// Every setting of a policy. Unset fields keep the preset's value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct PolicySpec {
    /// `default`, `exercise` or `strict`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<String>,
    /// Ticks per second (1000: milliseconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tick_hz: Option<u32>,
    /// First ceiling, ticks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<u64>,
    /// Largest ceiling, ticks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap: Option<u64>,
    /// Wait budget per call, ticks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<u64>,
    /// Deadline per call, ticks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<u64>,
    /// Attempt cap, the first attempt included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// Shortest attempt time, ticks (for the deadline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_attempt: Option<u64>,
    /// `equal`, `full`, `decorrelated` or `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<String>,
    /// `max` or `spread`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<String>,
    /// Longest Retry-After accepted, ticks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_retry_after: Option<u64>,
    /// Accept HTTP-date Retry-After values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_dates: Option<bool>,
    /// Refuse duplicate Retry-After headers (else take the longest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reject_duplicate_retry_after: Option<bool>,
    /// Exact status rules on top of the preset's table: `[[503, "retry_any"], …]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub statuses: Vec<(u16, String)>,
    /// The fleet retry budget shared with the calls made under this policy, if any. Not part of
    /// the policy's fingerprint: it is shared state, not a per-call setting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<FleetSpec>,
    /// Rate-limit headers read beside Retry-After (`[rate_limit] retry_after_ms = true`), all
    /// off when absent. A host setting, outside the core policy and its fingerprint: the
    /// adapters read the headers and hand the core the longest ask as the Retry-After.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<Signals>,
}

/// A fleet retry budget's settings (`wary::FleetBudget::new`): gRPC A6's `maxTokens` and
/// `tokenRatio` (in thousandths).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetSpec {
    /// Tokens, 1..=1000.
    pub tokens: u32,
    /// Thousandths of a token back per success, 1..=1000.
    pub ratio_milli: u32,
}

impl FleetSpec {
    /// Builds and checks the budget.
    pub fn build(&self) -> Result<wary::FleetBudget, SpecError> {
        Ok(wary::FleetBudget::new(self.tokens, self.ratio_milli)?)
    }
}

/// Why a spec could not become a policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// A name field holds an unknown value.
    #[error("unknown {field}: {value:?}")]
    UnknownName {
        /// The field.
        field: &'static str,
        /// What it held.
        value: String,
    },
    /// The policy builder refused the settings.
    #[error("invalid policy: {0}")]
    Policy(#[from] PolicyError),
}

fn rule_name(rule: Rule) -> &'static str {
    match rule {
        Rule::RetryAny => "retry_any",
        Rule::RetryIdempotent => "retry_idempotent",
        Rule::Fail => "fail",
    }
}

fn parse_rule(s: &str) -> Result<Rule, SpecError> {
    match s {
        "retry_any" => Ok(Rule::RetryAny),
        "retry_idempotent" => Ok(Rule::RetryIdempotent),
        "fail" => Ok(Rule::Fail),
        _ => Err(SpecError::UnknownName { field: "rule", value: s.to_owned() }),
    }
}

impl PolicySpec {
    /// The rate-limit signals this spec opts into (none when unset).
    pub fn signals(&self) -> Signals {
        self.rate_limit.unwrap_or_default()
    }

    /// Builds and checks the policy.
    pub fn build(&self) -> Result<Policy, SpecError> {
        let preset = match self.preset.as_deref() {
            None => Preset::Default,
            Some(name) => Preset::from_name(name)
                .ok_or_else(|| SpecError::UnknownName { field: "preset", value: name.to_owned() })?,
        };
        let mut b = Policy::builder(preset);
        let base_policy = b.build().ok();
        if let Some(v) = self.tick_hz {
            b = b.tick_hz(v);
        }
        if let Some(v) = self.base {
            b = b.base(v);
        }
        if let Some(v) = self.cap {
            b = b.cap(v);
        }
        if let Some(v) = self.budget {
            b = b.budget(v);
        }
        if let Some(v) = self.deadline {
            b = b.deadline(v);
        }
        if let Some(v) = self.max_attempts {
            b = b.max_attempts(v);
        }
        if let Some(v) = self.min_attempt {
            b = b.min_attempt(v);
        }
        if let Some(v) = self.max_retry_after {
            b = b.max_retry_after(v);
        }
        if let Some(name) = &self.jitter {
            let j = Jitter::from_name(name)
                .ok_or_else(|| SpecError::UnknownName { field: "jitter", value: name.clone() })?;
            b = b.jitter(j);
        }
        if let Some(name) = &self.retry_after {
            let m = match name.as_str() {
                "max" => RetryAfterMode::Max,
                "spread" => RetryAfterMode::Spread,
                _ => return Err(SpecError::UnknownName { field: "retry_after", value: name.clone() }),
            };
            b = b.retry_after_mode(m);
        }
        let preset_rules = base_policy.map(|p| *p.retry_after_rules()).unwrap_or(Rules::LENIENT);
        let rules = Rules {
            accept_dates: self.retry_after_dates.unwrap_or(preset_rules.accept_dates),
            duplicates: match self.reject_duplicate_retry_after {
                Some(true) => Duplicates::Reject,
                Some(false) => Duplicates::Longest,
                None => preset_rules.duplicates,
            },
        };
        b = b.retry_after_rules(rules);
        let mut table: Table = base_policy.map(|p| *p.table()).unwrap_or(Table::DEFAULT);
        for (code, rule) in &self.statuses {
            table = table.with_status(*code, parse_rule(rule)?)?;
        }
        Ok(b.table(table).build()?)
    }

    /// The spec of a policy made from `preset` and the builder settings (every field filled),
    /// with `statuses` as given (the table's own exact rules are not listed back).
    pub fn describe(preset: Preset, p: &Policy, statuses: &[(u16, Rule)]) -> PolicySpec {
        PolicySpec {
            preset: Some(preset.name().to_owned()),
            tick_hz: Some(p.tick_hz()),
            base: Some(p.backoff().base),
            cap: Some(p.backoff().cap),
            budget: Some(p.budget()),
            deadline: p.deadline(),
            max_attempts: p.max_attempts(),
            min_attempt: Some(p.min_attempt()),
            jitter: Some(p.backoff().jitter.name().to_owned()),
            retry_after: Some(p.retry_after_mode().name().to_owned()),
            max_retry_after: p.max_retry_after(),
            retry_after_dates: Some(p.retry_after_rules().accept_dates),
            reject_duplicate_retry_after: Some(p.retry_after_rules().duplicates == Duplicates::Reject),
            statuses: statuses.iter().map(|(c, r)| (*c, rule_name(*r).to_owned())).collect(),
            fleet: None,
            rate_limit: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_round_trips_to_the_same_policy() {
        let spec = PolicySpec {
            preset: Some("exercise".into()),
            tick_hz: Some(1),
            base: Some(2),
            cap: Some(60),
            budget: Some(120),
            statuses: vec![(503, "retry_any".into())],
            ..PolicySpec::default()
        };
        let p = spec.build().unwrap();
        let again = PolicySpec::describe(Preset::Exercise, &p, &[(503, Rule::RetryAny)]);
        let json = serde_json::to_string(&again).unwrap();
        let back: PolicySpec = serde_json::from_str(&json).unwrap();
        assert_eq!(back.build().unwrap(), p);
        assert_eq!(back.build().unwrap().fingerprint(), p.fingerprint());
    }

    #[test]
    fn bad_specs_are_typed_errors() {
        let s = PolicySpec { jitter: Some("wild".into()), ..PolicySpec::default() };
        assert!(matches!(s.build(), Err(SpecError::UnknownName { field: "jitter", .. })));
        let s = PolicySpec { base: Some(0), ..PolicySpec::default() };
        assert_eq!(s.build(), Err(SpecError::Policy(PolicyError::ZeroBase)));
        let f = FleetSpec { tokens: 0, ratio_milli: 100 };
        assert_eq!(f.build().err(), Some(SpecError::Policy(PolicyError::BadFleetBudget)));
        let t: PolicySpec = toml::from_str("base = 50\n[fleet]\ntokens = 10\nratio_milli = 100\n").unwrap();
        assert_eq!(t.fleet, Some(FleetSpec { tokens: 10, ratio_milli: 100 }));
        assert!(serde_json::from_str::<PolicySpec>(r#"{"bsae": 1}"#).is_err());
        let t: PolicySpec = toml::from_str("[rate_limit]\nretry_after_ms = true\n").unwrap();
        assert_eq!(t.signals(), Signals { retry_after_ms: true, ..Signals::NONE });
        assert_eq!(PolicySpec::default().signals(), Signals::NONE);
        assert!(toml::from_str::<PolicySpec>("[rate_limit]\nretry_after_sec = true\n").is_err());
    }
}

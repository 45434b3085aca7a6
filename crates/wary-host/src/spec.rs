//! A policy as configuration a person writes (TOML, JSON): a preset and the settings to change,
//! built through the core's [`PolicyBuilder`](wary::PolicyBuilder), every name read with the
//! core's `from_name`. Durations are milliseconds. The ledger does not carry this form: its
//! policy line is the built [`Policy`]'s own serde form ([`crate::ledger::Line`]).

use serde::{Deserialize, Serialize};
use wary::{
    Breaker, BreakerError, BreakerSettings, Duration, FleetBudgetError, Jitter, Pace, PaceError,
    PaceSettings, Policy, PolicyError, Preset, RetryAfterMode, Rule, TableError,
    retry_after::{Ambiguous, Rules},
};

use crate::ratelimit::Signals;

/// Every setting of a policy. Unset fields keep the preset's value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct PolicySpec {
    /// A [`Preset`] name: `default`, `basic` or `strict`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<String>,
    /// First ceiling, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<u64>,
    /// Largest ceiling, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap: Option<u64>,
    /// Wait budget per call, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<u64>,
    /// Deadline per call, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<u64>,
    /// Attempt cap, the first attempt included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// Shortest attempt time, milliseconds (for the deadline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_attempt: Option<u64>,
    /// A [`Jitter`] name: `equal`, `full`, `decorrelated` or `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<String>,
    /// A [`RetryAfterMode`] name: `max` or `spread`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<String>,
    /// Longest Retry-After accepted, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_retry_after: Option<u64>,
    /// Accept HTTP-date Retry-After values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_dates: Option<bool>,
    /// Refuse duplicate Retry-After headers (else take the longest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reject_duplicate_retry_after: Option<bool>,
    /// Exact status rules on top of the preset's table, each a status in 400..=599 and a
    /// [`Rule`] name: `[[503, "retry_any"], …]`.
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
    /// The endpoint's adaptive send rate (`[pace]`), off when absent. Shared state per
    /// endpoint like the fleet budget, outside the policy's fingerprint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pace: Option<PaceSpec>,
    /// The endpoint's circuit breaker (`[breaker]`), off when absent; outside the fingerprint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breaker: Option<BreakerSpec>,
}

/// A send rate's settings ([`PaceSettings`]); unset fields keep the defaults the program
/// chose ([`PaceSettings::DEVICE`] unless it says otherwise). Rates are thousandths of a
/// request a second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct PaceSpec {
    /// The rate the first throttle cuts from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_milli: Option<u32>,
    /// The lowest rate a cut reaches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor_milli: Option<u32>,
    /// The rate at which the pace opens again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ceiling_milli: Option<u32>,
    /// The share of the rate a throttle keeps, percent, 1..=99.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_percent: Option<u8>,
    /// The time to climb back to the rate cut from, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regrow_ms: Option<u64>,
    /// Requests that may go at once, 1..=100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u8>,
    /// The share of throttling answers let pass without a cut, percent, 0..=90.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerate_percent: Option<u8>,
}

impl PaceSpec {
    /// The settings, unset fields from `defaults`.
    pub fn settings(&self, defaults: PaceSettings) -> PaceSettings {
        PaceSettings {
            start_milli: self.start_milli.unwrap_or(defaults.start_milli),
            floor_milli: self.floor_milli.unwrap_or(defaults.floor_milli),
            ceiling_milli: self.ceiling_milli.unwrap_or(defaults.ceiling_milli),
            keep_percent: self.keep_percent.unwrap_or(defaults.keep_percent),
            regrow: self.regrow_ms.map_or(defaults.regrow, Duration::from_millis),
            burst: self.burst.unwrap_or(defaults.burst),
            tolerate_percent: self.tolerate_percent.unwrap_or(defaults.tolerate_percent),
        }
    }

    /// Builds and checks the pace.
    pub fn build(&self, defaults: PaceSettings) -> Result<Pace, SpecError> {
        Ok(Pace::new(self.settings(defaults))?)
    }
}

/// A circuit breaker's settings ([`BreakerSettings`]); unset fields keep the program's
/// defaults ([`BreakerSettings::DEVICE`] unless it says otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct BreakerSpec {
    /// Failures in a row that open it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold: Option<u8>,
    /// The first open time's ceiling, milliseconds (equal jitter: half of it fixed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_ms: Option<u64>,
    /// The longest open time's ceiling, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_open_ms: Option<u64>,
    /// Whether a refused connection opens it at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused_opens: Option<bool>,
}

impl BreakerSpec {
    /// The settings, unset fields from `defaults`.
    pub fn settings(&self, defaults: BreakerSettings) -> BreakerSettings {
        BreakerSettings {
            threshold: self.threshold.unwrap_or(defaults.threshold),
            open: self.open_ms.map_or(defaults.open, Duration::from_millis),
            max_open: self.max_open_ms.map_or(defaults.max_open, Duration::from_millis),
            refused_opens: self.refused_opens.unwrap_or(defaults.refused_opens),
        }
    }

    /// Builds and checks the breaker.
    pub fn build(&self, defaults: BreakerSettings) -> Result<Breaker, SpecError> {
        Ok(Breaker::new(self.settings(defaults))?)
    }
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
    /// A status rule was refused.
    #[error("invalid status rule: {0}")]
    Table(#[from] TableError),
    /// The fleet budget's settings were refused.
    #[error("invalid fleet budget: {0}")]
    Fleet(#[from] FleetBudgetError),
    /// The send rate's settings were refused.
    #[error("invalid pace: {0}")]
    Pace(#[from] PaceError),
    /// The circuit breaker's settings were refused.
    #[error("invalid breaker: {0}")]
    Breaker(#[from] BreakerError),
}

/// Reads a name with the core's `from_name`.
fn named<T>(field: &'static str, name: &str, from_name: fn(&str) -> Option<T>) -> Result<T, SpecError> {
    from_name(name).ok_or_else(|| SpecError::UnknownName { field, value: name.to_owned() })
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
            Some(name) => named("preset", name, Preset::from_name)?,
        };
        // A preset's own settings, for the fields changed one part at a time (the rules, the
        // table); every preset builds.
        let start = Policy::builder(preset).build()?;
        let ms = Duration::from_millis;
        let mut b = start.to_builder();
        if let Some(v) = self.base {
            b = b.base(ms(v));
        }
        if let Some(v) = self.cap {
            b = b.cap(ms(v));
        }
        if let Some(v) = self.budget {
            b = b.budget(ms(v));
        }
        if let Some(v) = self.deadline {
            b = b.deadline(ms(v));
        }
        if let Some(v) = self.max_attempts {
            b = b.max_attempts(v);
        }
        if let Some(v) = self.min_attempt {
            b = b.min_attempt(ms(v));
        }
        if let Some(v) = self.max_retry_after {
            b = b.max_retry_after(ms(v));
        }
        if let Some(name) = &self.jitter {
            b = b.jitter(named("jitter", name, Jitter::from_name)?);
        }
        if let Some(name) = &self.retry_after {
            b = b.retry_after_mode(named("retry_after", name, RetryAfterMode::from_name)?);
        }
        let preset_rules = *start.retry_after_rules();
        b = b.retry_after_rules(Rules {
            accept_dates: self.retry_after_dates.unwrap_or(preset_rules.accept_dates),
            ambiguous: match self.reject_duplicate_retry_after {
                Some(true) => Ambiguous::Reject,
                Some(false) => Ambiguous::Longest,
                None => preset_rules.ambiguous,
            },
        });
        let mut table = *start.table();
        for (code, rule) in &self.statuses {
            table = table.with_status(*code, named("rule", rule, Rule::from_name)?)?;
        }
        Ok(b.table(table).build()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_builds_through_the_core_and_its_policy_round_trips_exactly() {
        let spec = PolicySpec {
            preset: Some("basic".into()),
            base: Some(2_000),
            cap: Some(60_000),
            budget: Some(120_000),
            statuses: vec![(503, "retry_any".into())],
            ..PolicySpec::default()
        };
        let p = spec.build().unwrap();
        let want = Policy::builder(Preset::Basic)
            .base(Duration::from_secs(2))
            .cap(Duration::from_secs(60))
            .budget(Duration::from_secs(120))
            .table(wary::Table::BASIC.with_status(503, Rule::RetryAny).unwrap())
            .build()
            .unwrap();
        assert_eq!(p, want);
        // The policy's own serde form (the ledger's policy line) rebuilds it exactly, the
        // status rule included.
        let json = serde_json::to_string(&p).unwrap();
        let back: Policy = serde_json::from_str(&json).unwrap();
        assert_eq!(back, p);
        assert_eq!(back.fingerprint(), p.fingerprint());
        assert_eq!(back.table().status_rule(503), Rule::RetryAny);
        // The spec itself round-trips as data.
        let again: PolicySpec = serde_json::from_str(&serde_json::to_string(&spec).unwrap()).unwrap();
        assert_eq!(again.build().unwrap(), p);
    }

    #[test]
    fn bad_specs_are_typed_errors() {
        let s = PolicySpec { jitter: Some("wild".into()), ..PolicySpec::default() };
        assert!(matches!(s.build(), Err(SpecError::UnknownName { field: "jitter", .. })));
        let s = PolicySpec { preset: Some("exercise".into()), ..PolicySpec::default() };
        assert!(matches!(s.build(), Err(SpecError::UnknownName { field: "preset", .. })));
        let s = PolicySpec { statuses: vec![(503, "retry_sometimes".into())], ..PolicySpec::default() };
        assert!(matches!(s.build(), Err(SpecError::UnknownName { field: "rule", .. })));
        let s = PolicySpec { statuses: vec![(200, "retry_any".into())], ..PolicySpec::default() };
        assert_eq!(s.build(), Err(SpecError::Table(TableError::BadStatus)));
        let s = PolicySpec { base: Some(0), ..PolicySpec::default() };
        assert_eq!(s.build(), Err(SpecError::Policy(PolicyError::ZeroBase)));
        let f = FleetSpec { tokens: 0, ratio_milli: 100 };
        assert_eq!(f.build().err(), Some(SpecError::Fleet(FleetBudgetError::Tokens)));
        let t: PolicySpec = toml::from_str("base = 50\n[fleet]\ntokens = 10\nratio_milli = 100\n").unwrap();
        assert_eq!(t.fleet, Some(FleetSpec { tokens: 10, ratio_milli: 100 }));
        assert!(serde_json::from_str::<PolicySpec>(r#"{"bsae": 1}"#).is_err());
        // There is no tick rate: durations are milliseconds.
        assert!(toml::from_str::<PolicySpec>("tick_hz = 1\n").is_err());
        let t: PolicySpec = toml::from_str("[rate_limit]\nretry_after_ms = true\n").unwrap();
        assert_eq!(t.signals(), Signals { retry_after_ms: true, ..Signals::NONE });
        assert_eq!(PolicySpec::default().signals(), Signals::NONE);
        assert!(toml::from_str::<PolicySpec>("[rate_limit]\nretry_after_sec = true\n").is_err());
    }

    #[test]
    fn pace_and_breaker_settings_read_with_ms_durations_over_the_programs_defaults() {
        let t: PolicySpec =
            toml::from_str("[pace]\nstart_milli = 2000\nregrow_ms = 5000\n[breaker]\nopen_ms = 1000\n")
                .unwrap();
        let pace = t.pace.unwrap().build(PaceSettings::DEVICE).unwrap();
        assert_eq!(
            *pace.settings(),
            PaceSettings { start_milli: 2_000, regrow: Duration::from_secs(5), ..PaceSettings::DEVICE }
        );
        let breaker = t.breaker.unwrap().build(BreakerSettings::DEVICE).unwrap();
        assert_eq!(
            *breaker.settings(),
            BreakerSettings { open: Duration::from_secs(1), ..BreakerSettings::DEVICE }
        );
        // Absent, both are off; the policy and its fingerprint do not see them.
        assert_eq!((PolicySpec::default().pace, PolicySpec::default().breaker), (None, None));
        assert_eq!(t.build().unwrap().fingerprint(), PolicySpec::default().build().unwrap().fingerprint());
        // Refused settings are typed errors; unknown fields are refused.
        let bad = PaceSpec { keep_percent: Some(100), ..PaceSpec::default() };
        assert_eq!(bad.build(PaceSettings::DEVICE).err(), Some(SpecError::Pace(PaceError::Keep)));
        let bad = BreakerSpec { threshold: Some(0), ..BreakerSpec::default() };
        assert_eq!(
            bad.build(BreakerSettings::DEVICE).err(),
            Some(SpecError::Breaker(BreakerError::Threshold))
        );
        assert!(toml::from_str::<PolicySpec>("[pace]\nregrow = 5\n").is_err());
        let j: PolicySpec = serde_json::from_str(r#"{"breaker": {"threshold": 3}}"#).unwrap();
        assert_eq!(j.breaker.unwrap().settings(BreakerSettings::DEVICE).threshold, 3);
        let j: PolicySpec = serde_json::from_str(r#"{"breaker": {"refused_opens": true}}"#).unwrap();
        let settings = j.breaker.unwrap().settings(BreakerSettings::DEVICE);
        assert_eq!((settings.refused_opens, settings.threshold), (true, 2));
        assert!(!BreakerSpec::default().settings(BreakerSettings::DEVICE).refused_opens);
    }
}

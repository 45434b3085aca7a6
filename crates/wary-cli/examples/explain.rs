//! `wary explain` on the policy file beside this example, through the command's library: the
//! worked schedule, the classification grid and any warnings. No server.
//!
//! `cargo run -p wary-cli --example explain`

use wary::Duration;
use wary_cli::explain;
use wary_host::spec::PolicySpec;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let spec: PolicySpec = toml::from_str(include_str!("policy.toml"))?;
    let policy = spec.build()?;
    let mut e = explain::explain(&policy, Some(Duration::from_secs(60)));
    e.fleet = spec.fleet.and_then(|f| explain::fleet(f.tokens, f.ratio_milli));
    print!("{}", explain::render(&e, &policy));
    Ok(())
}

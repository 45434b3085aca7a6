//! The device scenarios of `cargo xtask qemu` and the demo: the `uplink` firmware under QEMU
//! (mps2-an386) sends its readings as HTTP/1.1 POSTs over the LAN9118 (`-nic
//! user,model=lan9118`) straight to the test cloud on the host's 127.0.0.1, which injects
//! HTTP- and TCP-level faults. Nothing sits between the device and the cloud.
//!
//! Every reading the firmware accepted into its outbox is logged with its id (`ACCEPTED
//! boot=… seq=…`); at the end the cloud's own report must show each of those keys applied
//! exactly once, no other key applied, and no key applied twice. A scenario may plan resets
//! (`SYSRESETREQ` from the firmware at a chosen point); each planned reset must happen, in the
//! boot it was planned for, and the run must still deliver everything.

use std::collections::{BTreeMap, BTreeSet};
use std::env;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::harness::{TARGET, build, elf_path, start_qemu, uplink_exited, wait_with_timeout};
use crate::util::{ensure_apt, ensure_cargo_install, ensure_targets, step};

/// The device id the firmware is given on its command line (`device=`), in every key. Its low
/// 32 bits are those of the id the firmware used before ids were 64 bits wide.
pub(crate) const DEVICE: u64 = 0x5741_5259_0a38_6001;
/// The credential the firmware is given (`token=`): a test value, no device's. The firmware
/// sends it as `Authorization: Bearer <token>` on every attempt (the test cloud ignores it); the
/// run fails if any line of the device's log shows any part of it.
pub(crate) const TOKEN: &str = "3c5e0f6a1d7b48c29e0a4f81b6d3572c0e9f1a2b3c4d5e6f708192a3b4c5d6e7";
/// A wedged guest must never hold CI; healthy runs take 5 to 40 s.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(240);

/// One device run: the cloud's faults and what the firmware is told.
pub struct Scenario {
    /// A name for the output.
    pub name: &'static str,
    /// The cloud's fault script (`wary-cloud --faults`).
    pub faults: &'static str,
    /// Readings the sensor makes per boot.
    pub readings: u32,
    /// The planned resets, as the firmware's arguments, and the kinds in the order they must
    /// happen.
    pub plan: &'static str,
    /// `RESET <kind>` lines expected, in order, with the boot each must happen in.
    pub resets: &'static [(&'static str, u32)],
    /// How the device reaches the cloud.
    pub route: Route,
}

/// How the device reaches the test cloud.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Plain HTTP, straight to the cloud.
    Direct,
    /// HTTPS through the gateway: the firmware built with its `tls` feature, a CA made for the
    /// run pinned in it; the gateway (`wary-gateway`, TLS on, bearer credentials from a file
    /// holding the SHA-256 of the device's token) checks the token and the key's device part
    /// and forwards each reading to the cloud as one keyed call.
    GatewayTls,
    /// HTTPS to the cloud through a TLS 1.3 terminator (`wary_fixtures::tls::terminate`): the
    /// firmware built with `tls` as for [`Route::GatewayTls`], each device connection relayed
    /// to one plain connection to the cloud, so the cloud's connection faults (its idle closes)
    /// reach the device as a TLS server's closes.
    TlsTerminator,
    /// Plain HTTP through the gateway, with the device's bearer credential checked (a
    /// credentials file as on the TLS route): for measuring the wire without TLS's bytes. The
    /// gateway answers a reading it could not land within 1 s of waits (2 s in all) with 503,
    /// under the device's 5 s attempt limit, and lets the device post 200 readings a second.
    Gateway,
}

/// A storm at the HTTP and TCP level, no resets: 503s, 429s with Retry-After in seconds and as
/// an HTTP-date, writes applied and then the connection reset, replies held past the attempt's
/// time limit, replies cut short, garbage status lines, header blocks too large for the
/// device's buffer, and a window in which the listener is closed (connections refused).
pub const STORM: Scenario = Scenario {
    name: "storm",
    faults: "503=0.12,429=0.05:ra=1,429=0.04:ra=date+2,reset_after_effect=0.06,\
             stall=0.04:ms=6000,truncated_reply=0.06,garbage_status=0.04,huge_header=0.06,\
             refuse_at=8:ms=1500,seed=7",
    readings: 20,
    // A cloud that fails a share of every request at random: a herd's pace would take its 20
    // readings past the time limit (docs/pacing.md, *A device alone under a flaky cloud*).
    plan: "pacing=off",
    resets: &[],
    route: Route::Direct,
};

/// The same kind of storm, and three resets: in boot 1 power fails part-way through a flash
/// write; in boot 2 the device resets while the reply to an applied write is outstanding (the
/// cloud holds replies of a share of writes for 2.5 s after applying them); in boot 3 it resets
/// half-way through a retry wait. Boot 4 delivers what is left.
pub const RESETS: Scenario = Scenario {
    name: "resets",
    faults: "503=0.12,429=0.05:ra=1,reset_after_effect=0.05,stall=0.1:ms=2500,\
             truncated_reply=0.04,garbage_status=0.03,huge_header=0.03,seed=11",
    readings: 6,
    // Boots after a reset are unhealthy and wait before their first attempt: a small base
    // keeps that wait to milliseconds here (the crash-loop scenario checks it).
    // Without the pace, as for the storm.
    plan: "cut_write=1:5 reset_in_reply=2 reset_in_backoff=3 boot_base=50 pacing=off",
    resets: &[("flash-write", 1), ("reply", 2), ("backoff", 3)],
    route: Route::Direct,
};

/// The device over TLS through the gateway, with its token, to a lightly faulted cloud (the
/// gateway's own upstream retries meet its 503s) that refuses one reading as it is (422, which
/// the gateway passes on as 424): 15 readings, no resets, the refused one in the device's dead
/// letters and reported to the gateway on the exchanges after. Short, so it adds little to a
/// CI run.
pub const GATEWAY_TLS: Scenario = Scenario {
    name: "gateway-tls",
    faults: "503=0.2,429=0.05:ra=1,poison=3,seed=3",
    readings: 15,
    plan: "",
    resets: &[],
    route: Route::GatewayTls,
};

/// A cloud that refuses the device for its first 15 s as an upstream whose credential expired
/// (401 to everything, never applied), and that refuses the third reading as it is (422,
/// however often it comes): the device must hold its outbox through the refusals, probing one
/// request at a time (2 s doubling to 4 s here), go on with the hold after a reset in the
/// middle of it (boot 1), then land every reading once, and move the third to its dead letters
/// on flash without deleting it or sending it again.
pub const ENDPOINT_FAULT: Scenario = Scenario {
    name: "endpoint-fault",
    faults: "outage=0:ms=15000:status=401,poison=3,seed=5",
    readings: 6,
    plan: "hold_base=2000 hold_cap=4000 reset_in_hold=1 boot_base=50",
    resets: &[("hold", 1)],
    route: Route::Direct,
};

/// The name the gateway's certificate carries and the TLS firmware expects (SNI and `Host`).
const SERVER_NAME: &str = wary_fixtures::tls::SERVER_NAME;
/// The device's new token in the second gateway run, which the gateway learns only once the
/// device has been refused with it a few times (a rotation done in the wrong order).
const ROTATED_TOKEN: &str = "5b0e3d9a7c1f42e68a9d0c3b7e5f1a24c6d8e0f2a4b6c8d0e2f4a6b8c0d2e4f6";
/// Readings of the rotation run: kept through the refusals, each applied once after.
const ROTATED_READINGS: u32 = 2;

/// Runs the device scenario called `name` alone and prints its report (`cargo xtask device
/// <name>`, `cargo xtask qemu --scenario <name>`).
pub fn run_named(root: &Path, name: &str) -> Result<()> {
    let text = match name {
        "idle-close" => crate::keepalive::idle_close(root)?,
        "idle-close-tls" => crate::keepalive::idle_close_tls(root)?,
        "drain" => crate::keepalive::drain(root)?,
        "crash-loop" => crate::crash_loop::run(root)?,
        "breaker-hold" => crate::breaker_hold::run(root)?,
        "coap" => crate::coap::coap(root)?,
        "coap-storm" => crate::coap::coap_storm(root)?,
        "mqtt" => crate::mqtt::run(root)?,
        "mqtt-tls" => crate::mqtt_tls::run(root)?,
        "mqtt-gateway" => crate::mqtt_gateway::run(root)?,
        _ => {
            let Some(scenario) =
                [&STORM, &RESETS, &GATEWAY_TLS, &ENDPOINT_FAULT].into_iter().find(|s| s.name == name)
            else {
                bail!(
                    "no device scenario `{name}` (storm, resets, gateway-tls, endpoint-fault, crash-loop, breaker-hold, idle-close, idle-close-tls, drain, coap, coap-storm, mqtt, mqtt-tls, mqtt-gateway)"
                );
            };
            run(root, scenario)?
        }
    };
    step(&format!("device scenario `{name}` passed"));
    println!("{text}");
    Ok(())
}

/// Runs `scenario` and returns its report; the first line is `uplink: key=value …` (readings,
/// landed, gave_up, mean, p95, resets), which the demo shows.
pub fn run(root: &Path, scenario: &Scenario) -> Result<String> {
    // Over TLS the wire is watched: handshakes and bytes per reading.
    let pcap = (scenario.route == Route::GatewayTls).then(|| root.join("target/bench/gateway-tls.pcap"));
    if let Some(dir) = pcap.as_deref().and_then(Path::parent) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let extra = Extra { pcap: pcap.as_deref(), ..Extra::default() };
    let RouteRun { lines, report, elapsed, gateway_seen, tls, bins, .. } = run_route(root, scenario, &extra)?;
    let log = Log::read(&lines);
    let text = check(scenario, &log, &report)?;
    let mut out = vec![text];
    if let Some(seen) = &gateway_seen {
        out.push(format!(
            "route: the uplink over TLS 1.3 (CA pinned at build time, server name {SERVER_NAME}) with its bearer token, through wary-gateway on 127.0.0.1:{} to the cloud",
            seen.port
        ));
        out.push(format!("gateway: {}", seen.metrics_line()));
        if seen.refused() != 0 {
            bail!("{}: the gateway refused {} of the device's requests", scenario.name, seen.refused());
        }
        // The device reports its dead letters on the exchanges after them, and the gateway
        // shows the last report.
        let dead = scenario.faults.matches("poison=").count() as u64;
        let reported = seen.sum(&format!("wary_gateway_device_dead_letters{{device=\"{DEVICE:016x}\"}}"));
        if reported != dead {
            bail!(
                "{}: the gateway shows {reported} dead letters for the device, it holds {dead}",
                scenario.name
            );
        }
        out.push(format!(
            "gateway: the device reported {reported} dead letter (Wary-Dead-Letters), shown on /metrics"
        ));
    }
    if let Some(pcap) = &pcap {
        out.push(tls_sessions(scenario, &lines, pcap)?);
    }
    if let Some(tls) = &tls {
        out.push(rotation(&bins, tls)?);
        out.push(upstream_key_expired(&bins, tls)?);
        out.push(untrusted_certificate(&bins, tls)?);
        out.push(tls_batches(&bins, tls)?);
    }
    out.push(format!("wall time {elapsed:.1} s"));
    Ok(out.join("\n"))
}

/// What a run adds to a [`Scenario`].
#[derive(Default)]
pub struct Extra<'a> {
    /// Appended to the firmware's command line.
    pub append: &'a str,
    /// Dumps the guest's wire here (QEMU's `filter-dump`, a classic pcap).
    pub pcap: Option<&'a Path>,
    /// After this long from the start of QEMU, puts this fault script in force.
    pub switch: Option<(Duration, &'a str)>,
}

/// A run's report, the device's log lines, and when the fault script was switched.
pub struct Run {
    pub report: String,
    pub lines: Vec<String>,
    pub switched_at: Option<std::time::SystemTime>,
}

/// [`run`] with [`Extra`], on the scenario's route: the checked report and what the run saw.
pub fn run_with(root: &Path, scenario: &Scenario, more: &Extra<'_>) -> Result<Run> {
    let run = run_route(root, scenario, more)?;
    let log = Log::read(&run.lines);
    let text = check(scenario, &log, &run.report)?;
    Ok(Run {
        report: format!("{text}\nwall time {:.1} s", run.elapsed),
        lines: run.lines,
        switched_at: run.switched_at,
    })
}

/// Builds and runs `scenario` to its end: the device's log lines (credential checked), the
/// cloud's report and the host's seconds.
pub(crate) fn run_device(root: &Path, scenario: &Scenario) -> Result<(Vec<String>, serde_json::Value, f64)> {
    let run = run_route(root, scenario, &Extra::default())?;
    Ok((run.lines, run.report, run.elapsed))
}

/// Builds and runs `scenario`'s route to its end (cloud, gateway where the route has one, the
/// uplink under QEMU), checking that no log line shows the credential.
fn run_route(root: &Path, scenario: &Scenario, more: &Extra<'_>) -> Result<RouteRun> {
    ensure_targets(&[TARGET])?;
    ensure_apt("qemu-system-arm", "qemu-system-arm")?;
    ensure_cargo_install("defmt-print", "defmt-print", &[])?;
    let firmware = root.join(crate::harness::QEMU_BOARD);
    build(&firmware)?;
    let bins = host_bins(root, scenario.route)?;

    step(&format!("device scenario `{}`: cloud faults `{}`", scenario.name, scenario.faults));
    let mut cloud = Cloud::start(&bins.cloud, scenario.faults)?;
    let (elf, tls) = match scenario.route {
        Route::Direct | Route::Gateway => (elf_path(&firmware, "uplink"), None),
        Route::GatewayTls | Route::TlsTerminator => {
            let tls = TlsRun::prepare(&firmware)?;
            (tls.elf.clone(), Some(tls))
        }
    };
    let plain = match scenario.route {
        Route::Gateway => Some(PlainGateway::prepare()?),
        _ => None,
    };
    let gateway = match (&tls, &plain) {
        (Some(tls), _) if scenario.route == Route::GatewayTls => {
            Some(GatewayProc::start(&bins.gateway, tls, cloud.port)?)
        }
        (None, Some(plain)) => Some(GatewayProc::start_plain(&bins.gateway, plain, cloud.port)?),
        _ => None,
    };
    let terminator = match &tls {
        Some(tls) if scenario.route == Route::TlsTerminator => {
            Some(wary_fixtures::tls::terminate(std::sync::Arc::new(tls.chain.cloud_config()?), cloud.port)?)
        }
        _ => None,
    };
    let port = gateway.as_ref().map(|g| g.port).or(terminator.as_ref().map(|t| t.port)).unwrap_or(cloud.port);
    let started = Instant::now();
    let switcher = more.switch.map(|(after, faults)| {
        let (port, faults) = (cloud.port, faults.to_owned());
        thread::spawn(move || {
            thread::sleep(after);
            let at = std::time::SystemTime::now();
            put_faults(port, &faults).map(|()| at)
        })
    });
    let (status, lines) = run_uplink(&elf, port, TOKEN, scenario.readings, scenario.plan, TIMEOUT, more)?;
    let switched_at = match switcher {
        Some(handle) => Some(handle.join().map_err(|_| anyhow::anyhow!("the fault switch panicked"))??),
        None => None,
    };
    let gateway_seen = gateway.map(GatewayProc::stop).transpose()?;
    if let Some(terminator) = terminator {
        let relayed = terminator.stop();
        let handshakes = relayed.iter().filter(|r| r.handshake).count();
        let closed = relayed.iter().filter(|r| r.closed_by_upstream).count();
        let failed = relayed.iter().filter(|r| r.upstream_failed).count();
        println!(
            "    TLS terminator: {} connections, {handshakes} handshakes; the cloud closed {closed} (close_notify and FIN to the device), reset {failed}",
            relayed.len()
        );
    }
    let report = cloud.stop()?;
    let elapsed = started.elapsed().as_secs_f64();
    if let Some(seen) = &gateway_seen
        && let Some(line) = seen.stderr.iter().find(|line| shows_token(line))
    {
        bail!(
            "{}: a gateway log line shows part of the device's credential: {:?}",
            scenario.name,
            line.replace(TOKEN, "…")
        );
    }
    uplink_exited(scenario.name, status, TIMEOUT)?;
    if let Some(line) = lines.iter().find(|line| shows_token(line)) {
        bail!(
            "{}: a device log line shows part of its credential: {:?}",
            scenario.name,
            line.replace(TOKEN, "…")
        );
    }
    Ok(RouteRun { lines, report, elapsed, gateway_seen, tls, bins, switched_at })
}

/// What one run of a scenario's route left: the device's log lines (credential checked), the
/// cloud's report, the host's seconds, and for the TLS route what the gateway saw and the
/// run's files (for the wrong-token run).
struct RouteRun {
    lines: Vec<String>,
    report: serde_json::Value,
    elapsed: f64,
    gateway_seen: Option<GatewaySeen>,
    tls: Option<TlsRun>,
    bins: HostBins,
    /// When [`Extra::switch`] put its fault script in force.
    switched_at: Option<std::time::SystemTime>,
}

/// The host programs a route needs, built (debug) in the root workspace.
pub(crate) struct HostBins {
    pub(crate) cloud: PathBuf,
    pub(crate) gateway: PathBuf,
}

pub(crate) fn host_bins(root: &Path, route: Route) -> Result<HostBins> {
    let packages: &[&str] = match route {
        Route::Direct => &["-p", "wary-cloud"],
        Route::GatewayTls | Route::Gateway => &["-p", "wary-cloud", "-p", "wary-gateway"],
        Route::TlsTerminator => &["-p", "wary-cloud"],
    };
    step(&format!(
        "building the host programs ({})",
        packages.iter().filter(|p| **p != "-p").copied().collect::<Vec<_>>().join(", ")
    ));
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .arg("build")
        .args(packages)
        .arg("--bins")
        .current_dir(root)
        .status()
        .context("cargo")?;
    if !status.success() {
        bail!("`cargo build {}` failed with {status}", packages.join(" "));
    }
    let target_dir = env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), |d| root.join(d));
    let debug = target_dir.join("debug");
    Ok(HostBins { cloud: debug.join("wary-cloud"), gateway: debug.join("wary-gateway") })
}

/// [`run_uplink`] with the scenarios' device, token and time limit, for a route of its own
/// (the CoAP scenarios).
pub(crate) fn run_uplink_elf(
    elf: &Path,
    port: u16,
    readings: u32,
    plan: &str,
    more: &Extra<'_>,
) -> Result<(Option<std::process::ExitStatus>, Vec<String>)> {
    run_uplink(elf, port, TOKEN, readings, plan, TIMEOUT, more)
}

/// Runs the uplink ELF under QEMU against `port` on the host; its exit status (None: killed
/// at `timeout`) and its decoded log lines.
pub(crate) fn run_uplink(
    elf: &Path,
    port: u16,
    token: &str,
    readings: u32,
    plan: &str,
    timeout: Duration,
    more: &Extra<'_>,
) -> Result<(Option<std::process::ExitStatus>, Vec<String>)> {
    let seed = std::process::id();
    let append = format!(
        "device={DEVICE:016x} token={token} port={port} seed={seed} readings={readings} {plan} {}",
        more.append
    );
    let elf_arg = elf.to_str().context("firmware path is not UTF-8")?;
    let dump = match more.pcap {
        Some(path) => {
            let _ = std::fs::remove_file(path);
            Some(format!(
                "filter-dump,id=f0,netdev=n0,file={}",
                path.to_str().context("pcap path is not UTF-8")?
            ))
        }
        None => None,
    };
    let mut extra = match &dump {
        Some(dump) => {
            vec!["-netdev", "user,id=n0", "-net", "nic,netdev=n0,model=lan9118", "-object", dump.as_str()]
        }
        None => vec!["-nic", "user,model=lan9118"],
    };
    extra.extend(["-serial", "none", "-append", append.trim()]);
    let (mut qemu, mut printer) = start_qemu(elf_arg, &extra, Stdio::inherit(), Stdio::piped())?;
    let log = printer.stdout.take().context("defmt-print stdout")?;
    let reader = thread::spawn(move || {
        let mut lines = vec![];
        for line in BufReader::new(log).lines().map_while(Result::ok) {
            // The per-exchange debug lines would drown the rest.
            if !line.contains(" http: ") {
                println!("    {line}");
            }
            lines.push(line);
        }
        lines
    });
    let status = wait_with_timeout(&mut qemu, timeout)?;
    let _ = printer.wait();
    let lines = reader.join().unwrap_or_default();
    Ok((status, lines))
}

/// The files of one TLS run: a throwaway chain made here (`wary_fixtures::tls::TestChain`),
/// its root pinned in the uplink built with feature `tls`, the gateway's certificate (for
/// [`SERVER_NAME`], issued by the chain's intermediate) and key, and the credentials file
/// admitting [`DEVICE`] with the SHA-256 of [`TOKEN`]. All in a temporary folder removed on
/// drop; the private keys never leave it.
struct TlsRun {
    dir: PathBuf,
    elf: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    credentials: PathBuf,
    /// The run's chain: the TLS terminator's certificate comes from it.
    chain: wary_fixtures::tls::TestChain,
}

impl TlsRun {
    fn prepare(firmware: &Path) -> Result<TlsRun> {
        use sha2::{Digest, Sha256};
        step("building the uplink with `--features tls`, a CA made for this run pinned in it");
        let dir = env::temp_dir().join(format!("wary-gateway-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let run = TlsRun {
            elf: dir.join("uplink-tls"),
            cert: dir.join("gateway.pem"),
            key: dir.join("gateway.key"),
            credentials: dir.join("credentials"),
            dir,
            chain: wary_fixtures::tls::TestChain::new()?,
        };
        let ca = run.dir.join("pinned-ca.der");
        std::fs::write(&ca, run.chain.root.der())?;
        let (cert, key) = run.chain.leaf_pem(SERVER_NAME)?;
        std::fs::write(&run.cert, cert)?;
        std::fs::write(&run.key, key)?;
        let digest: String = Sha256::digest(TOKEN.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        std::fs::write(
            &run.credentials,
            format!("# the QEMU device of `cargo xtask qemu`\n{DEVICE:016x} {digest}\n"),
        )?;
        let ca_arg = ca.to_str().context("temp path is not UTF-8")?.to_owned();
        crate::harness::build_uplink_variant(
            firmware,
            "wary-qemu/tls",
            &[],
            &[("WARY_CA_DER", ca_arg.as_str()), ("WARY_SERVER_NAME", SERVER_NAME)],
            &run.elf,
        )?;
        Ok(run)
    }
}

impl Drop for TlsRun {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The gateway as a child process: TLS on, bearer credentials, upstream the test cloud, its
/// metrics on a loopback port of its own.
struct GatewayProc {
    child: Child,
    port: u16,
    metrics: u16,
    stderr: Option<thread::JoinHandle<Vec<String>>>,
}

/// What the gateway said and counted, once stopped.
struct GatewaySeen {
    port: u16,
    stderr: Vec<String>,
    /// The metrics' sample lines (no comments).
    metrics: Vec<String>,
}

/// The files of a plain-HTTP gateway run: the credentials file admitting [`DEVICE`] and the
/// gateway's policy, in a temporary folder removed on drop.
struct PlainGateway {
    dir: PathBuf,
    credentials: PathBuf,
    policy: PathBuf,
}

impl PlainGateway {
    fn prepare() -> Result<PlainGateway> {
        use sha2::{Digest, Sha256};
        let dir = env::temp_dir().join(format!("wary-gateway-plain-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let run = PlainGateway { credentials: dir.join("credentials"), policy: dir.join("policy.json"), dir };
        let digest: String = Sha256::digest(TOKEN.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        std::fs::write(&run.credentials, format!("{DEVICE:016x} {digest}\n"))?;
        std::fs::write(&run.policy, r#"{"budget": 1000, "deadline": 2000, "min_attempt": 100}"#)?;
        Ok(run)
    }
}

impl Drop for PlainGateway {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl GatewayProc {
    fn start(bin: &Path, tls: &TlsRun, upstream: u16) -> Result<GatewayProc> {
        let path = |p: &Path| p.to_str().map(str::to_owned).context("temp path is not UTF-8");
        let args = [
            "--credentials".to_owned(),
            path(&tls.credentials)?,
            "--tls-cert".to_owned(),
            path(&tls.cert)?,
            "--tls-key".to_owned(),
            path(&tls.key)?,
        ];
        Self::spawn(bin, upstream, &args, "https")
    }

    fn start_plain(bin: &Path, plain: &PlainGateway, upstream: u16) -> Result<GatewayProc> {
        let path = |p: &Path| p.to_str().map(str::to_owned).context("temp path is not UTF-8");
        let args = [
            "--insecure-plain-http".to_owned(),
            "--credentials".to_owned(),
            path(&plain.credentials)?,
            "--policy".to_owned(),
            path(&plain.policy)?,
            "--rate".to_owned(),
            "200".to_owned(),
            "--burst".to_owned(),
            "400".to_owned(),
        ];
        Self::spawn(bin, upstream, &args, "http")
    }

    fn spawn(bin: &Path, upstream: u16, args: &[String], scheme: &str) -> Result<GatewayProc> {
        let mut child = Command::new(bin)
            .args(["--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"])
            .args(["--upstream", &format!("http://127.0.0.1:{upstream}")])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut err = BufReader::new(child.stderr.take().context("gateway stderr")?);
        let (mut port, mut metrics) = (None, None);
        let mut seen = vec![];
        while port.is_none() {
            let mut line = String::new();
            if err.read_line(&mut line).context("reading the gateway's output")? == 0 {
                bail!("the gateway stopped before it listened: {seen:?}");
            }
            let tail_port = |marker: &str| {
                after(&line, marker).and_then(|rest| {
                    rest.trim().trim_end_matches("/metrics").rsplit(':').next()?.parse().ok()
                })
            };
            if line.contains("metrics on http://") {
                metrics = tail_port("metrics on ");
            }
            if line.contains(&format!("listening on {scheme}://")) {
                port = tail_port("listening on ");
            }
            seen.push(line.trim_end().to_owned());
        }
        let stderr = thread::spawn(move || {
            seen.extend(err.lines().map_while(Result::ok));
            seen
        });
        Ok(GatewayProc {
            child,
            port: port.context("no port")?,
            metrics: metrics.context("the gateway printed no metrics address")?,
            stderr: Some(stderr),
        })
    }

    /// Reads its metrics, then stops it.
    fn stop(mut self) -> Result<GatewaySeen> {
        let metrics = scrape(self.metrics)?;
        let _ = self.child.kill();
        let _ = self.child.wait();
        let stderr = self.stderr.take().map(|h| h.join().unwrap_or_default()).unwrap_or_default();
        Ok(GatewaySeen { port: self.port, stderr, metrics })
    }
}

impl Drop for GatewayProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET /metrics` from the gateway's loopback metrics port: the sample lines.
pub(crate) fn scrape(port: u16) -> Result<Vec<String>> {
    let mut stream =
        std::net::TcpStream::connect(("127.0.0.1", port)).context("connecting to the gateway's metrics")?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")?;
    let mut text = String::new();
    stream.read_to_string(&mut text).context("reading the gateway's metrics")?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok(body.lines().filter(|l| l.starts_with("wary_gateway_")).map(str::to_owned).collect())
}

impl GatewaySeen {
    /// The sum of a counter's samples whose name and labels start with `prefix`.
    fn sum(&self, prefix: &str) -> u64 {
        self.metrics
            .iter()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .map(|v| v as u64)
            .sum()
    }

    fn refused(&self) -> u64 {
        self.sum("wary_gateway_refused_total")
    }

    /// Calls by verdict and refusals by reason, the non-zero ones.
    fn metrics_line(&self) -> String {
        let shown: Vec<&str> = self
            .metrics
            .iter()
            .filter(|l| {
                l.starts_with("wary_gateway_calls_total") || l.starts_with("wary_gateway_refused_total")
            })
            .filter(|l| !l.ends_with(" 0"))
            .map(String::as_str)
            .collect();
        if shown.is_empty() { "no calls, no refusals".into() } else { shown.join(", ") }
    }
}

/// The most TLS handshakes per delivered reading the `gateway-tls` run may take: the session is
/// kept across attempts and readings, so a handful of handshakes carry all 15 readings (one
/// handshake per request would be 1.0 or more).
const TLS_HANDSHAKES_PER_READING: f64 = 0.34;

/// The TLS route's connections: the device's TCP connections (each carries one full TLS 1.3
/// handshake), the SYNs and bytes on its wire from the pcap, per delivered reading; added to
/// target/bench/results.json (`device_gateway_tls`). Fails if the session was not kept.
fn tls_sessions(scenario: &Scenario, lines: &[String], pcap: &Path) -> Result<String> {
    let counts = crate::keepalive::http_counts(lines)?;
    let get = |k: &str| counts.get(k).copied().unwrap_or(0);
    let (syns, frames, bytes) = crate::keepalive::wire_totals(pcap)?;
    let n = f64::from(scenario.readings);
    let handshakes = get("connects");
    let per_reading = handshakes as f64 / n;
    let text = format!(
        "TLS sessions: {handshakes} handshakes ({syns} SYNs on the wire) for {} readings in {} exchanges \
         ({} on a reused session; {} closed by the gateway and seen before a write, {} idled out): \
         {per_reading:.3} handshakes per reading; {frames} frames, {bytes} B on the wire ({:.0} B per reading)",
        scenario.readings,
        get("exchanges"),
        get("reused"),
        get("stale_before_write"),
        get("idle_closed"),
        bytes as f64 / n,
    );
    let results = pcap.with_file_name("results.json");
    let mut all = std::fs::read_to_string(&results)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .filter(serde_json::Value::is_object)
        .unwrap_or_else(|| serde_json::json!({}));
    all["device_gateway_tls"] = serde_json::json!({
        "readings": scenario.readings,
        "handshakes": handshakes,
        "syns": syns,
        "exchanges": get("exchanges"),
        "frames": frames,
        "bytes": bytes,
        "handshakes_per_reading": per_reading,
        "bytes_per_reading": bytes as f64 / n,
    });
    std::fs::write(&results, serde_json::to_string_pretty(&all)?)
        .with_context(|| format!("writing {}", results.display()))?;
    if per_reading > TLS_HANDSHAKES_PER_READING {
        bail!(
            "{text}
{}: the TLS session was not kept (at most {TLS_HANDSHAKES_PER_READING} handshakes per reading)",
            scenario.name
        );
    }
    Ok(text)
}

/// One of the `gateway-tls` runs in which something a person set up wrong refuses the device
/// for a while and is then fixed: what the device logged and how it ended, what the gateway
/// counted, and the cloud's report.
struct FaultRun {
    status: Option<std::process::ExitStatus>,
    log: Log,
    lines: Vec<String>,
    seen: GatewaySeen,
    report: serde_json::Value,
}

/// Runs the TLS uplink with `token` and `readings` through a gateway to a cloud with `faults`,
/// the hold's probes 2 s doubling to 4 s (about a minute to an hour on a fielded device); `fix`
/// runs beside the device, and mends what was wrong once it has seen enough.
fn fault_run(
    bins: &HostBins,
    tls: &TlsRun,
    faults: &str,
    token: &'static str,
    readings: u32,
    fix: impl FnOnce(&GatewayProc) -> Result<()>,
) -> Result<FaultRun> {
    let mut cloud = Cloud::start(&bins.cloud, faults)?;
    let gateway = GatewayProc::start(&bins.gateway, tls, cloud.port)?;
    let (elf, port) = (tls.elf.clone(), gateway.port);
    let device = thread::spawn(move || {
        let plan = "hold_base=2000 hold_cap=4000";
        run_uplink(&elf, port, token, readings, plan, Duration::from_secs(180), &Extra::default())
    });
    let fixed = fix(&gateway);
    let (status, lines) = device.join().map_err(|_| anyhow::anyhow!("the device thread panicked"))??;
    let seen = gateway.stop()?;
    let report = cloud.stop()?;
    fixed?;
    Ok(FaultRun { status, log: Log::read(&lines), lines, seen, report })
}

impl FaultRun {
    /// What is wrong with a run that should have kept every reading through the fault and then
    /// landed each of `readings` once, none dead-lettered.
    fn landed_once(&self, readings: u32) -> Vec<String> {
        let summary = self.log.summary.as_deref().unwrap_or_default();
        let keys = self.report["keys"].as_object().cloned().unwrap_or_default();
        let once = self
            .log
            .accepted
            .iter()
            .all(|&(b, q)| keys.get(&key_hex(b, q)).is_some_and(|k| k["effects"] == 1));
        let mut errors = vec![];
        if !self.status.is_some_and(|s| s.success()) {
            errors
                .push(format!("the uplink should land every reading once fixed, it ended {:?}", self.status));
        }
        if !summary.contains(&format!("landed={readings} dead_lettered=0 ")) || !summary.contains(" left=0 ")
        {
            errors.push(format!("expected landed={readings} dead_lettered=0 left=0: {summary}"));
        }
        if self.log.accepted.len() != readings as usize || !once || keys.len() != self.log.accepted.len() {
            errors.push(format!(
                "expected each of {readings} readings applied once: {} keys at the cloud",
                keys.len()
            ));
        }
        if let Some(line) = self.seen.stderr.iter().chain(&self.lines).find(|l| shows_token(l)) {
            errors.push(format!("a log line shows the token: {line:?}"));
        }
        errors
    }
}

/// Fails `run` named `what` with `errors`, if any.
fn judged(what: &str, errors: Vec<String>) -> Result<()> {
    if errors.is_empty() {
        return Ok(());
    }
    bail!("device scenario `gateway-tls` ({what}) failed:\n  {}", errors.join("\n  "))
}

/// Sends SIGHUP to the gateway: it reads its credentials and certificate files again.
fn reload(gateway: &GatewayProc) -> Result<()> {
    let status = Command::new("kill").args(["-HUP", &gateway.child.id().to_string()]).status()?;
    if !status.success() {
        bail!("could not send SIGHUP to the gateway");
    }
    Ok(())
}

/// The same TLS uplink with a token the gateway does not know yet, as when a credential was
/// rotated on the device before the gateway's file: every probe gets 401, which is the
/// endpoint's refusal, not the reading's. The device must keep every reading and hold its
/// outbox, probing one request at a time on the hold's backoff, with the cloud seeing nothing.
/// Once the gateway has the new token (its file rewritten with both tokens, then SIGHUP), the
/// next probe lands and so does every reading, each applied once.
fn rotation(bins: &HostBins, tls: &TlsRun) -> Result<String> {
    use sha2::{Digest, Sha256};
    step(&format!(
        "device scenario `gateway-tls`, second run: a rotated token the gateway learns late, {ROTATED_READINGS} readings"
    ));
    let unauthenticated = "wary_gateway_refused_total{reason=\"unauthenticated\"}";
    let mut refused_before = 0;
    let run = fault_run(bins, tls, "seed=1", ROTATED_TOKEN, ROTATED_READINGS, |gateway| {
        // Two refused probes: the device is held and probing, not spending its readings.
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        while refused_before < 2 && std::time::Instant::now() < deadline {
            thread::sleep(Duration::from_millis(250));
            let seen = GatewaySeen { port: gateway.port, stderr: vec![], metrics: scrape(gateway.metrics)? };
            refused_before = seen.sum(unauthenticated);
        }
        let digest = |token: &str| -> String {
            Sha256::digest(token.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
        };
        std::fs::write(
            &tls.credentials,
            format!(
                "# the QEMU device of `cargo xtask qemu`, its old token and its new one\n{DEVICE:016x} {}\n{DEVICE:016x} {}\n",
                digest(TOKEN),
                digest(ROTATED_TOKEN)
            ),
        )?;
        reload(gateway)
    })?;
    let refused = run.seen.sum(unauthenticated);
    let mut errors = run.landed_once(ROTATED_READINGS);
    if refused_before < 2 {
        errors.push(format!(
            "the gateway refused {refused_before} probes before the rotation, expected 2 or more"
        ));
    }
    if u64::from(run.log.held) != refused || refused < 2 {
        errors.push(format!(
            "expected one HELD line per refused probe: {} lines, the gateway refused {refused}",
            run.log.held
        ));
    }
    if let Some(line) = run.lines.iter().chain(&run.seen.stderr).find(|l| l.contains(&ROTATED_TOKEN[48..])) {
        errors.push(format!("a log line shows the new token: {line:?}"));
    }
    judged("rotation", errors)?;
    Ok(format!(
        "rotation: {refused} probes refused 401 while the gateway had only the old token (one request each, the outbox held and every reading kept), then all {ROTATED_READINGS} landed once: {}",
        run.log.summary.unwrap_or_default()
    ))
}

/// Readings of the untrusted-certificate run.
const UNTRUSTED_READINGS: u32 = 2;
/// How long the gateway serves a certificate from a CA the device does not pin.
const UNTRUSTED_FOR: Duration = Duration::from_secs(8);

/// The same TLS uplink while the gateway serves, for [`UNTRUSTED_FOR`], a certificate for the
/// right name from a CA the device does not pin (a deploy that shipped the wrong chain), then
/// its own again (files swapped, SIGHUP). Each refused handshake is the endpoint's fault: the
/// device must keep its readings and hold, sending no request, and land each once after.
fn untrusted_certificate(bins: &HostBins, tls: &TlsRun) -> Result<String> {
    step(&format!(
        "device scenario `gateway-tls`, fourth run: a certificate the device does not trust for {} s, {UNTRUSTED_READINGS} readings",
        UNTRUSTED_FOR.as_secs()
    ));
    let (good_cert, good_key) = (std::fs::read(&tls.cert)?, std::fs::read(&tls.key)?);
    let rogue = wary_fixtures::tls::TestChain::new()?;
    let (cert, key) = rogue.leaf_pem(SERVER_NAME)?;
    std::fs::write(&tls.cert, cert)?;
    std::fs::write(&tls.key, key)?;
    let run = fault_run(bins, tls, "seed=2", TOKEN, UNTRUSTED_READINGS, |gateway| {
        thread::sleep(UNTRUSTED_FOR);
        std::fs::write(&tls.cert, &good_cert)?;
        std::fs::write(&tls.key, &good_key)?;
        reload(gateway)
    });
    // The good chain is back for the runs after this one, whatever happened.
    std::fs::write(&tls.cert, &good_cert)?;
    std::fs::write(&tls.key, &good_key)?;
    let run = run?;
    let mut errors = run.landed_once(UNTRUSTED_READINGS);
    if run.log.held == 0 {
        errors.push("the refused handshakes never held the outbox".to_owned());
    }
    let ok = run.seen.sum("wary_gateway_calls_total{verdict=\"ok\"}");
    if ok != u64::from(UNTRUSTED_READINGS) {
        errors.push(format!(
            "the gateway made {ok} calls that landed, expected {UNTRUSTED_READINGS}: {}",
            run.seen.metrics_line()
        ));
    }
    judged("untrusted certificate", errors)?;
    Ok(format!(
        "untrusted certificate: {} refused handshakes in {} s held the outbox (no request sent, every reading kept), then all {UNTRUSTED_READINGS} landed once: {}",
        run.log.held,
        UNTRUSTED_FOR.as_secs(),
        run.log.summary.unwrap_or_default()
    ))
}

/// How long the cloud refuses the gateway's own credential in the `gateway-tls` run of an
/// expired upstream key.
const UPSTREAM_KEY_EXPIRED: Duration = Duration::from_secs(12);
/// Readings of that run.
const UPSTREAM_KEY_READINGS: u32 = 3;

/// The same TLS uplink, its token good, through a gateway whose own upstream credential has
/// expired: the cloud answers the gateway 401 to everything for [`UPSTREAM_KEY_EXPIRED`], then
/// is fixed. That 401 is the gateway's misconfiguration, not the reading: the gateway must hold
/// the device (503 with a Retry-After from its upstream breaker, never 424), the device must keep
/// every reading, none dead-lettered, and each must be applied once after the fix.
fn upstream_key_expired(bins: &HostBins, tls: &TlsRun) -> Result<String> {
    step(&format!(
        "device scenario `gateway-tls`, third run: the gateway's upstream key refused 401 for {} s, {UPSTREAM_KEY_READINGS} readings",
        UPSTREAM_KEY_EXPIRED.as_secs()
    ));
    let faults = format!("outage=0:ms={}:status=401,seed=4", UPSTREAM_KEY_EXPIRED.as_millis());
    let run = fault_run(bins, tls, &faults, TOKEN, UPSTREAM_KEY_READINGS, |_| Ok(()))?;
    // The gateway's own calls upstream end `failed` (its calls_total says so); what it answers
    // the device must be a hold, never 424.
    let held = run.seen.sum("wary_gateway_held_total");
    let answered_424 = run
        .lines
        .iter()
        .filter(|l| l.contains(wary::ledger::DEVICE_TAG) && l.contains(" status 424 "))
        .count();
    let mut errors = run.landed_once(UPSTREAM_KEY_READINGS);
    if held == 0 || answered_424 != 0 {
        errors.push(format!(
            "expected the gateway to hold the device, never answer 424: held {held}, 424s {answered_424}; {}",
            run.seen.metrics_line()
        ));
    }
    judged("upstream key expired", errors)?;
    Ok(format!(
        "upstream key expired: the cloud refused the gateway 401 for {} s; the gateway held the device {held} times (503 + Retry-After, no 424), the device kept its readings and all {UPSTREAM_KEY_READINGS} landed once: {}",
        UPSTREAM_KEY_EXPIRED.as_secs(),
        run.log.summary.unwrap_or_default()
    ))
}

/// The third `gateway-tls` run: the same TLS uplink with batches of 16, its readings queued
/// while the cloud answers 503 to everything, then drained through the gateway in batches
/// inside the kept session once the cloud is well.
const TLS_BATCHES: Scenario = Scenario {
    name: "gateway-tls batches",
    faults: "503=1,seed=1",
    readings: 40,
    plan: "batch=16",
    resets: &[],
    route: Route::GatewayTls,
};
/// How long the cloud of [`TLS_BATCHES`] is down from QEMU's start: DHCP and the 40 readings
/// (one every 60 ms) fit before.
const TLS_BATCHES_OUTAGE: Duration = Duration::from_secs(5);

fn tls_batches(bins: &HostBins, tls: &TlsRun) -> Result<String> {
    step(&format!(
        "device scenario `gateway-tls`, third run: {} readings over TLS with batches of 16, queued while the cloud answers 503",
        TLS_BATCHES.readings
    ));
    let mut cloud = Cloud::start(&bins.cloud, TLS_BATCHES.faults)?;
    let gateway = GatewayProc::start(&bins.gateway, tls, cloud.port)?;
    let switch = {
        let port = cloud.port;
        thread::spawn(move || {
            thread::sleep(TLS_BATCHES_OUTAGE);
            put_faults(port, "seed=1")
        })
    };
    let run = run_uplink(
        &tls.elf,
        gateway.port,
        TOKEN,
        TLS_BATCHES.readings,
        TLS_BATCHES.plan,
        TIMEOUT,
        &Extra::default(),
    );
    switch.join().map_err(|_| anyhow::anyhow!("the fault switch panicked"))??;
    let seen = gateway.stop()?;
    let report = cloud.stop()?;
    let (status, lines) = run?;
    if !status.is_some_and(|s| s.success()) {
        bail!("{}: the uplink failed under QEMU: {status:?}", TLS_BATCHES.name);
    }
    let text = check(&TLS_BATCHES, &Log::read(&lines), &report)?;
    let counts = crate::keepalive::http_counts(&lines)?;
    let get = |k: &str| counts.get(k).copied().unwrap_or(0);
    let (batches, items, handshakes) = (get("batches"), get("batch_items"), get("connects"));
    if batches == 0 || items < 2 * batches {
        bail!(
            "{}: {batches} batches carrying {items} readings: the backlog did not drain in batches",
            TLS_BATCHES.name
        );
    }
    // One handshake, and one more for each time the gateway's reply or an idle gap closed the session.
    if handshakes > 4 {
        bail!(
            "{}: {handshakes} TLS handshakes for {} readings: the session was not kept",
            TLS_BATCHES.name,
            TLS_BATCHES.readings
        );
    }
    Ok(format!(
        "TLS batches: {batches} batches carried {items} readings in {handshakes} TLS sessions through the gateway ({}); {}",
        seen.metrics_line(),
        text.lines().find(|l| l.contains("exactly once")).unwrap_or("every reading applied once")
    ))
}

/// Puts `faults` in force on the cloud at 127.0.0.1:`port` (`POST /admin/faults`).
pub(crate) fn put_faults(port: u16, faults: &str) -> Result<()> {
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).context("connecting to the cloud")?;
    let request = format!(
        "POST /admin/faults HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{faults}",
        faults.len()
    );
    conn.write_all(request.as_bytes())?;
    let mut reply = String::new();
    conn.read_to_string(&mut reply)?;
    if !reply.starts_with("HTTP/1.1 200") {
        bail!("the cloud refused the fault script `{faults}`: {}", reply.lines().next().unwrap_or_default());
    }
    Ok(())
}

/// The test cloud as a child process: its address from its first line, its report (one JSON
/// line) when its standard input closes.
pub(crate) struct Cloud {
    child: Child,
    stdin: Option<ChildStdin>,
    pub(crate) port: u16,
    out: Option<thread::JoinHandle<String>>,
}

impl Cloud {
    pub(crate) fn start(bin: &Path, faults: &str) -> Result<Cloud> {
        let mut child = Command::new(bin)
            .args(["--listen", "127.0.0.1:0", "--faults", faults, "--exit-on-stdin-close"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stdin = child.stdin.take();
        let mut out = BufReader::new(child.stdout.take().context("cloud stdout")?);
        let mut first = String::new();
        out.read_line(&mut first).context("reading the cloud's address")?;
        let port = first
            .trim()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .with_context(|| format!("the cloud printed no address: {first:?}"))?;
        let out = thread::spawn(move || {
            let mut rest = String::new();
            let _ = out.read_to_string(&mut rest);
            rest
        });
        Ok(Cloud { child, stdin, port, out: Some(out) })
    }

    /// Closes its standard input and reads its final report.
    pub(crate) fn stop(&mut self) -> Result<serde_json::Value> {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.flush();
        }
        let status = wait_with_timeout(&mut self.child, Duration::from_secs(15))?;
        let text = self.out.take().map(|h| h.join().unwrap_or_default()).unwrap_or_default();
        if !status.is_some_and(|s| s.success()) {
            bail!("the test cloud did not stop cleanly: {status:?}");
        }
        serde_json::from_str(text.trim())
            .with_context(|| format!("the cloud printed no JSON report: {text:?}"))
    }
}

impl Drop for Cloud {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the firmware's log says, across its boots.
#[derive(Debug, Default)]
pub(crate) struct Log {
    /// Boot numbers in the order they started.
    pub(crate) boots: Vec<u32>,
    /// Every reading accepted into the outbox, as (boot, seq).
    pub(crate) accepted: BTreeSet<(u32, u32)>,
    /// `RESET` lines: kind, boot, the rest of the line.
    pub(crate) resets: Vec<(String, u32, String)>,
    /// The last boot's `SUMMARY` fields.
    pub(crate) summary: Option<String>,
    /// Readings moved to the dead letters (`DEAD_LETTER` lines), as (boot, seq).
    pub(crate) dead: BTreeSet<(u32, u32)>,
    /// `HELD` lines: probes the endpoint refused, each holding the outbox.
    pub(crate) held: u32,
    /// Boots that went on with an endpoint hold from flash (`RESUME hold`).
    pub(crate) resumed_holds: Vec<u32>,
    /// Attempts of each call that reached a verdict, and calls cut off by a reset.
    calls: Vec<u32>,
    interrupted: u32,
    gave_up: u32,
}

impl Log {
    pub(crate) fn read(lines: &[String]) -> Log {
        let mut log = Log::default();
        let mut open: BTreeMap<String, u32> = BTreeMap::new();
        for line in lines {
            if let Some(rest) = after(line, "BOOT ") {
                let boot = rest.split(':').next().and_then(|b| b.trim().parse().ok()).unwrap_or(0);
                log.boots.push(boot);
                log.interrupted += u32::try_from(open.len()).unwrap_or(u32::MAX);
                open.clear();
            } else if let Some(rest) = after(line, "ACCEPTED ") {
                let field = |name: &str| rest.split_whitespace().find_map(|kv| kv.strip_prefix(name));
                let boot = field("boot=").and_then(|b| u32::from_str_radix(b, 16).ok());
                let seq = field("seq=").and_then(|s| s.parse().ok());
                if let (Some(b), Some(s)) = (boot, seq) {
                    log.accepted.insert((b, s));
                }
            } else if let Some(rest) = after(line, "DEAD_LETTER ") {
                let field = |name: &str| rest.split_whitespace().find_map(|kv| kv.strip_prefix(name));
                let boot = field("boot=").and_then(|b| u32::from_str_radix(b, 16).ok());
                let seq = field("seq=").and_then(|s| s.trim_end_matches(':').parse().ok());
                if let (Some(b), Some(s)) = (boot, seq) {
                    log.dead.insert((b, s));
                }
            } else if line.contains("HELD reason=") {
                log.held += 1;
            } else if line.contains("RESUME hold") {
                log.resumed_holds.push(log.boots.last().copied().unwrap_or(0));
            } else if let Some(rest) = after(line, "RESET ") {
                let kind = rest.split(':').next().unwrap_or_default().to_owned();
                log.resets.push((kind, log.boots.last().copied().unwrap_or(0), rest.to_owned()));
            } else if let Some(rest) = after(line, "SUMMARY ") {
                log.summary = Some(rest.to_owned());
            } else if line.contains(wary::ledger::DEVICE_TAG) {
                // The core writes the device line and reads it back: one format, one version.
                let Ok(record) = wary::ledger::parse_device_line(line) else {
                    continue;
                };
                let key = record.key.to_hex().as_str().to_owned();
                let n = open.entry(key.clone()).or_insert(0);
                *n += 1;
                if let Some(verdict) = record.verdict {
                    log.calls.push(*n);
                    if matches!(verdict, wary::Verdict::GaveUp(_)) {
                        log.gave_up += 1;
                    }
                    open.remove(&key);
                }
            }
        }
        log
    }
}

/// True if `line` holds any 16 consecutive hex digits of [`TOKEN`].
pub(crate) fn shows_token(line: &str) -> bool {
    (0..=TOKEN.len() - 16).any(|at| line.contains(&TOKEN[at..at + 16]))
}

fn after<'a>(line: &'a str, marker: &str) -> Option<&'a str> {
    line.find(marker).and_then(|at| line.get(at + marker.len()..))
}

pub(crate) fn key_hex(boot: u32, seq: u32) -> String {
    wary::Key::from_parts(DEVICE, boot, seq).to_hex().as_str().to_owned()
}

/// Checks the run against the cloud's report; returns the summary text.
pub(crate) fn check(scenario: &Scenario, log: &Log, report: &serde_json::Value) -> Result<String> {
    let summary = log.summary.as_deref().context("the firmware printed no SUMMARY line")?;
    let keys = report["keys"].as_object().context("no keys in the cloud's report")?;
    let mut errors = vec![];

    // Each planned reset happened, in its boot, in order; and nothing else reset the device.
    let kinds: Vec<(&str, u32)> = log.resets.iter().map(|(k, b, _)| (k.as_str(), *b)).collect();
    if kinds != scenario.resets {
        errors.push(format!("resets {kinds:?}, planned {:?}", scenario.resets));
    }
    let expected_boots = scenario.resets.len() + 1;
    if log.boots.len() != expected_boots {
        errors.push(format!("{} boots, expected {expected_boots}: {:?}", log.boots.len(), log.boots));
    }
    if log.boots.windows(2).any(|w| w[1] <= w[0]) {
        errors.push(format!("the boot counter did not go up at every boot: {:?}", log.boots));
    }

    // Every accepted reading applied exactly once, or (one for each key the cloud's script
    // poisons) in the dead letters and never applied; nothing else applied.
    let poisoned = scenario.faults.matches("poison=").count();
    if log.dead.len() != poisoned {
        errors.push(format!(
            "{} readings dead-lettered {:?}, the cloud poisons {poisoned}",
            log.dead.len(),
            log.dead
        ));
    }
    // An outage answering an endpoint's refusal (401, 403, 404…) must hold the outbox, not
    // spend the readings.
    if scenario.faults.contains(":status=4") && scenario.faults.contains("outage=") && log.held == 0 {
        errors.push("the cloud refused the device for a while, but the outbox was never held".to_owned());
    }
    let mut lost = vec![];
    let mut twice = vec![];
    let mut table = vec![];
    for &(boot, seq) in &log.accepted {
        let key = key_hex(boot, seq);
        let effects = keys.get(&key).and_then(|k| k["effects"].as_u64()).unwrap_or(0);
        let replays = keys.get(&key).and_then(|k| k["replays"].as_u64()).unwrap_or(0);
        let dead = log.dead.contains(&(boot, seq));
        match effects {
            0 if dead => {}
            _ if dead => twice.push(format!("({boot},{seq}) dead-lettered yet applied ×{effects}")),
            0 => lost.push(format!("({boot},{seq})")),
            1 => {}
            _ => twice.push(format!("({boot},{seq}) ×{effects}")),
        }
        table.push(format!("({boot},{seq}) {effects}/{replays}"));
    }
    let accepted_keys: BTreeSet<String> = log.accepted.iter().map(|&(b, s)| key_hex(b, s)).collect();
    let strangers: Vec<&String> = keys.keys().filter(|k| !accepted_keys.contains(*k)).collect();
    let duplicates = report["cloud"]["duplicates"]["keys"].as_u64().unwrap_or(u64::MAX);
    if !lost.is_empty() {
        errors.push(format!("lost (never applied): {}", lost.join(" ")));
    }
    if !twice.is_empty() || duplicates != 0 {
        errors.push(format!("applied more than once: {} (cloud duplicates {duplicates})", twice.join(" ")));
    }
    if !strangers.is_empty() {
        errors.push(format!("the cloud applied keys the device never accepted: {strangers:?}"));
    }
    if log.accepted.len() != scenario.readings as usize * expected_boots {
        // A boot cut short by a reset makes fewer readings; only the last must make them all.
        let last = log.boots.last().copied().unwrap_or(0);
        let in_last = log.accepted.iter().filter(|(b, _)| *b == last).count();
        if in_last != scenario.readings as usize {
            errors.push(format!("the last boot accepted {in_last} readings, expected {}", scenario.readings));
        }
    }
    // A reset with a reply outstanding: that write had landed, and its resend was answered from
    // the cloud's record.
    let mut reset_lines = vec![];
    for (i, (kind, boot, rest)) in log.resets.iter().enumerate() {
        let mut line = format!("reset {} in boot {boot}: {rest}", i + 1);
        if kind == "reply" {
            let key = rest.split_whitespace().find_map(|kv| kv.strip_prefix("key=")).unwrap_or_default();
            let entry = &keys.get(key).cloned().unwrap_or_default();
            let (effects, replays) =
                (entry["effects"].as_u64().unwrap_or(0), entry["replays"].as_u64().unwrap_or(0));
            if effects != 1 || replays == 0 {
                errors.push(format!(
                    "the write cut off by the reset ({key}): {effects} effects, {replays} replays"
                ));
            }
            line.push_str(&format!(" → at the cloud: {effects} effect, {replays} replays of its resends"));
        }
        if kind == "hold" && !log.resumed_holds.contains(&(boot + 1)) {
            errors.push(format!(
                "the reset during the hold in boot {boot}: boot {} did not go on with it",
                boot + 1
            ));
        }
        reset_lines.push(line);
    }
    if !errors.is_empty() {
        bail!("device scenario `{}` failed:\n  {}", scenario.name, errors.join("\n  "));
    }

    let mut calls = log.calls.clone();
    calls.sort_unstable();
    let n = calls.len().max(1);
    let attempts: u32 = calls.iter().sum();
    let mean = f64::from(attempts) / n as f64;
    let p95 = calls.get((n * 95).div_ceil(100).saturating_sub(1)).copied().unwrap_or(0);
    let max = calls.last().copied().unwrap_or(0);
    let cloud = &report["cloud"];
    let first = format!(
        "uplink: readings={} landed={} gave_up={} mean={mean:.3} p95={p95} max={max} calls={} resets={}",
        log.accepted.len(),
        log.accepted.len() - lost.len(),
        log.gave_up,
        calls.len(),
        log.resets.len()
    );
    let mut out = vec![
        first,
        format!("last boot: {summary}"),
        format!(
            "boots {:?}; calls cut off by a reset {}; attempts per call mean {mean:.3}, p95 {p95}, max {max} over {} calls",
            log.boots,
            log.interrupted,
            calls.len()
        ),
    ];
    out.extend(reset_lines);
    out.push(format!(
        "cloud: requests {}, replays {}, faults {}, by status {}",
        cloud["requests"], cloud["replays"], cloud["faults_injected"], cloud["requests_by_status"]
    ));
    out.push(format!("per-key effects/replays (boot,seq): {}", table.join("  ")));
    out.push(format!(
        "{} keys of device {DEVICE:016x}: {} applied exactly once, {} in the dead letters (never applied); duplicates 0, lost 0; the outbox held {} times",
        log.accepted.len(),
        log.accepted.len() - log.dead.len(),
        log.dead.len(),
        log.held
    ));
    Ok(out.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_owned).collect()
    }

    const RUN: &str = "\
0.009 INFO  BOOT 1: 0 pending, boot range reset Some(Corrupted)
0.016 INFO  ACCEPTED boot=00000001 seq=0
0.020 INFO  wary-ledger v4 574152590a3860010000000100000000 1 keyed_write reset 0 -1 retry unit 1 68 3 3 - - -1 1 0 - -
0.040 INFO  RESET reply: no reply after 800 ms, key=574152590a3860010000000100000000
0.007 INFO  BOOT 2: 1 pending
0.013 INFO  ACCEPTED boot=00000002 seq=0
0.020 INFO  wary-ledger v4 574152590a3860010000000100000000 1 keyed_write ok 0 -1 ok none 0 0 19 19 ok - -1 1 0 - -
0.030 INFO  wary-ledger v4 574152590a3860010000000200000000 1 keyed_write status 503 -1 retry unit 1 68 3 3 - - -1 1 0 - -
0.040 INFO  wary-ledger v4 574152590a3860010000000200000000 2 keyed_write status 503 -1 retry unit 1 68 3 3 gave_up budget -1 1 0 - -
0.041 INFO  wary-ledger v1 0a386001000000030000000000000000 1 keyed_write ok 0 -1 ok none 0 0 19 19 ok - -1 1
0.042 INFO  wary-ledger v2 0a386001000000030000000000000000 1 keyed_write ok 0 -1 ok none 0 0 19 19 ok - -1 1 0
0.050 INFO  SUMMARY device=574152590a386001 boot=2 landed=1";

    #[test]
    fn a_line_with_any_part_of_the_token_is_caught() {
        assert!(shows_token(&format!("0.1 INFO  http: Authorization: Bearer {TOKEN}")));
        assert!(shows_token(&format!("x{}y", &TOKEN[30..46])));
        assert!(!shows_token(&format!("x{}y", &TOKEN[30..45])));
        assert!(!RUN.lines().any(shows_token));
    }

    #[test]
    fn reads_boots_acceptances_resets_and_calls_across_boots() {
        let log = Log::read(&lines(RUN));
        assert_eq!(log.boots, vec![1, 2]);
        assert_eq!(log.accepted, BTreeSet::from([(1, 0), (2, 0)]));
        assert_eq!(log.resets.len(), 1);
        assert_eq!((log.resets[0].0.as_str(), log.resets[0].1), ("reply", 1));
        // The first key's first call was cut off by the reset, its second took one attempt, the
        // second key took two; lines of the older formats are not read as calls.
        assert_eq!(log.interrupted, 1);
        assert_eq!(log.calls, vec![1, 2]);
        assert_eq!(log.gave_up, 1);
        assert_eq!(log.summary.as_deref(), Some("device=574152590a386001 boot=2 landed=1"));
    }

    fn report(effects: &[((u32, u32), u64, u64)], duplicates: u64) -> serde_json::Value {
        let mut keys = serde_json::Map::new();
        for &((b, s), e, r) in effects {
            keys.insert(key_hex(b, s), serde_json::json!({"effects": e, "replays": r}));
        }
        serde_json::json!({"keys": keys, "cloud": {"duplicates": {"keys": duplicates}}})
    }

    const ONE_RESET: Scenario = Scenario {
        name: "t",
        faults: "",
        readings: 1,
        plan: "",
        resets: &[("reply", 1)],
        route: Route::Direct,
    };

    fn log_with_reply_key(key: &str) -> Log {
        Log {
            boots: vec![1, 2],
            accepted: BTreeSet::from([(1, 0), (2, 0)]),
            resets: vec![("reply".into(), 1, format!("reply: no reply, key={key}"))],
            summary: Some("x".into()),
            calls: vec![1, 1],
            ..Log::default()
        }
    }

    #[test]
    fn exactly_once_passes_and_every_other_count_fails() {
        let log = log_with_reply_key(&key_hex(1, 0));
        let good = report(&[((1, 0), 1, 1), ((2, 0), 1, 0)], 0);
        let text = check(&ONE_RESET, &log, &good).unwrap();
        assert!(text.contains("duplicates 0, lost 0"), "{text}");
        assert!(text.starts_with("uplink: readings=2 landed=2"), "{text}");

        let lost = report(&[((1, 0), 1, 1)], 0);
        assert!(check(&ONE_RESET, &log, &lost).unwrap_err().to_string().contains("lost"));
        let twice = report(&[((1, 0), 2, 1), ((2, 0), 1, 0)], 1);
        assert!(check(&ONE_RESET, &log, &twice).unwrap_err().to_string().contains("more than once"));
        let stranger = report(&[((1, 0), 1, 1), ((2, 0), 1, 0), ((2, 7), 1, 0)], 0);
        assert!(check(&ONE_RESET, &log, &stranger).unwrap_err().to_string().contains("never accepted"));
        // The write cut off by the reset must have landed and had its resend replayed.
        let not_replayed = report(&[((1, 0), 1, 0), ((2, 0), 1, 0)], 0);
        assert!(check(&ONE_RESET, &log, &not_replayed).unwrap_err().to_string().contains("cut off"));
    }

    #[test]
    fn the_gateways_counters_are_summed_by_name_and_label() {
        let seen = GatewaySeen {
            port: 1,
            stderr: vec![],
            metrics: lines(
                "wary_gateway_calls_total{verdict=\"ok\"} 15\n\
                 wary_gateway_calls_total{verdict=\"gave_up\"} 0\n\
                 wary_gateway_refused_total{reason=\"unauthenticated\"} 2\n\
                 wary_gateway_refused_total{reason=\"forbidden\"} 1\n\
                 wary_gateway_refused_total{reason=\"full\"} 0",
            ),
        };
        assert_eq!(seen.refused(), 3);
        assert_eq!(seen.sum("wary_gateway_refused_total{reason=\"unauthenticated\"}"), 2);
        assert_eq!(seen.sum("wary_gateway_calls_total"), 15);
        let shown = seen.metrics_line();
        assert!(shown.contains("verdict=\"ok\"} 15") && !shown.contains("gave_up"), "{shown}");
    }

    #[test]
    fn a_planned_reset_that_did_not_happen_fails() {
        let mut log = log_with_reply_key(&key_hex(1, 0));
        log.resets.clear();
        log.boots = vec![1];
        log.accepted = BTreeSet::from([(1, 0)]);
        let r = report(&[((1, 0), 1, 0)], 0);
        let err = check(&ONE_RESET, &log, &r).unwrap_err().to_string();
        assert!(err.contains("planned"), "{err}");
    }
}

//! `wary-gateway`: devices post readings over HTTP (`POST /readings` with `Idempotency-Key`),
//! or publish them to an MQTT broker (`--mqtt`); each goes upstream as one wary call, and the
//! device is answered (the message acknowledged) after its verdict.

use std::fs::OpenOptions;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use http::header::{HeaderName, HeaderValue};
use wary_gateway::admission::Limits;
use wary_gateway::tls::Tls;
use wary_gateway::{Auth, BodyCheck, Config, Credentials, Gateway, StaticHeader};
use wary_host::spec::PolicySpec;

#[derive(Parser)]
#[command(
    about = "wary gateway: devices' readings over HTTP to any upstream, answered after their verdict",
    version
)]
struct Args {
    /// Where devices connect (`POST /readings`).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// The upstream, `http://host:port`.
    #[arg(long)]
    upstream: String,
    /// The upstream path readings are posted to (default `/readings`; `/legacy/readings` with
    /// `--legacy`).
    #[arg(long)]
    path: Option<String>,
    /// The upstream's idempotency header.
    #[arg(long, default_value = "Idempotency-Key")]
    key_header: String,
    /// A static header sent upstream, `Name: value` (not for secrets: see --header-file).
    #[arg(long = "header", value_name = "NAME: VALUE")]
    headers: Vec<String>,
    /// A static header whose value is read from a file, `Name=PATH` (an API token; never logged).
    #[arg(long = "header-file", value_name = "NAME=PATH")]
    header_files: Vec<String>,
    /// A static header whose value is read from an environment variable, `Name=VAR` (never logged).
    #[arg(long = "header-env", value_name = "NAME=VAR")]
    header_envs: Vec<String>,
    /// Opt-in body check: a 2xx must carry this content type (else: landed, bad body).
    #[arg(long, conflicts_with = "require_json_field")]
    require_content_type: Option<String>,
    /// Opt-in body check: a 2xx must be a JSON object with this field (else: landed, bad body).
    #[arg(long)]
    require_json_field: Option<String>,
    /// Legacy mode: the upstream has no idempotency keys; unkeyed POSTs, probe on `unknown`.
    #[arg(long)]
    legacy: bool,
    /// Serve Prometheus text on this loopback address (`GET /metrics`).
    #[arg(long, default_value = "127.0.0.1:9464", conflicts_with = "no_metrics")]
    metrics: SocketAddr,
    /// Serve no metrics endpoint.
    #[arg(long)]
    no_metrics: bool,
    /// Append the JSON-lines ledger here.
    #[arg(long)]
    ledger: Option<PathBuf>,
    /// A policy spec (JSON) instead of the default.
    #[arg(long)]
    policy: Option<PathBuf>,
    /// Queue capacity: readings waiting for a worker; beyond it devices get 503 at once.
    #[arg(long, default_value_t = 1024)]
    queue: usize,
    /// Concurrent upstream calls.
    #[arg(long, default_value_t = 64)]
    workers: usize,
    /// Largest request body accepted, bytes.
    #[arg(long, default_value_t = 16 * 1024)]
    max_body: usize,
    /// Most readings in one `POST /readings/batch` (413 above).
    #[arg(long, default_value_t = wary_host::batch::MAX_ITEMS)]
    batch_max_items: usize,
    /// Largest `POST /readings/batch` body, bytes (413 above).
    #[arg(long, default_value_t = wary_host::batch::MAX_BATCH_BYTES)]
    batch_max_bytes: usize,
    /// Time per attempt, milliseconds.
    #[arg(long, default_value_t = 5000)]
    attempt_timeout_ms: u64,
    /// Legacy mode: wait this long before probing a write that may still be in flight,
    /// milliseconds (default: the attempt timeout).
    #[arg(long)]
    probe_grace_ms: Option<u64>,
    /// Worker threads (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// The device credentials file: `<device id, 16 hex> <SHA-256 of its token, 64 hex>` a
    /// line, at most two lines a device (its old and its new token, while a new one is rolled
    /// out); reloaded on SIGHUP. Make lines with `wary-gateway credential new <device>`.
    #[arg(long, required_unless_present_any = ["insecure_no_auth", "mqtt"])]
    credentials: Option<PathBuf>,
    /// Accept readings from anyone who can reach the gateway, with any key (tests only).
    #[arg(long, conflicts_with = "credentials")]
    insecure_no_auth: bool,
    /// The TLS certificate chain (PEM, leaf first); reloaded on SIGHUP.
    #[arg(long, requires = "tls_key", required_unless_present_any = ["insecure_plain_http", "mqtt"])]
    tls_cert: Option<PathBuf>,
    /// The TLS private key (PEM); reloaded on SIGHUP.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Mutual TLS: ask devices for a certificate this CA (PEM) issued, naming the device as
    /// `urn:wary:device:<16 hex>`; such a device needs no bearer token (it must still have a
    /// line in the credentials file). Reloaded on SIGHUP.
    #[arg(long, requires = "tls_cert", requires = "credentials")]
    tls_client_ca: Option<PathBuf>,
    /// Serve devices over plain HTTP instead of TLS (tests, or behind a TLS terminator).
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key"])]
    insecure_plain_http: bool,
    /// Requests a second one device may keep up (0: no per-device limit).
    #[arg(long, default_value_t = 5)]
    rate: u32,
    /// Requests one device may make at once after a quiet time.
    #[arg(long, default_value_t = 20)]
    burst: u32,
    /// Devices holding a rate bucket at once.
    #[arg(long, default_value_t = 100_000)]
    max_devices: usize,
    /// Time for a request body once its head is in, milliseconds (408 after).
    #[arg(long, default_value_t = 10_000)]
    body_timeout_ms: u64,
    /// Send keys upstream as `<device id>:<key>` (for devices that do not use wary's key layout).
    #[arg(long)]
    device_prefix: bool,
    /// Pace the upstream calls with the adaptive send rate and break the circuit when the
    /// upstream is down (their settings are the policy's `[pace]` and `[breaker]`): the
    /// default, accepted for scripts that ask for it explicitly.
    #[arg(long, conflicts_with = "no_upstream_pacing")]
    upstream_pacing: bool,
    /// Send upstream without the adaptive send rate and the circuit breaker.
    #[arg(long)]
    no_upstream_pacing: bool,
    /// Take readings from this MQTT 5 broker (`host:port`) instead of serving HTTP: devices log
    /// in to the broker, which checks who they are and what topic they may use.
    #[arg(
        long,
        value_name = "HOST:PORT",
        requires = "mqtt_client_id",
        conflicts_with_all = ["credentials", "tls_cert", "insecure_no_auth"]
    )]
    mqtt: Option<String>,
    /// The shared subscription's group (`$share/<group>/wary/+/readings`).
    #[arg(long, default_value = "wary", requires = "mqtt")]
    mqtt_group: String,
    /// This replica's client id: give a restarted replica the same one, so the messages it had
    /// not acknowledged come back to it.
    #[arg(long, requires = "mqtt")]
    mqtt_client_id: Option<String>,
    /// The gateway's username on the broker.
    #[arg(long, default_value = "gateway", requires = "mqtt")]
    mqtt_username: String,
    /// A file holding the gateway's broker password (never logged).
    #[arg(long, requires = "mqtt", conflicts_with = "mqtt_password_env")]
    mqtt_password_file: Option<PathBuf>,
    /// An environment variable holding the gateway's broker password (never logged).
    #[arg(long, requires = "mqtt")]
    mqtt_password_env: Option<String>,
    /// How long the broker keeps this replica's session (and queues for it) while it is away,
    /// seconds: longer than any restart of the replica can take.
    #[arg(long, default_value_t = 86_400, requires = "mqtt")]
    mqtt_session_expiry_secs: u32,
    /// Receive Maximum: messages the broker may have unacknowledged with this replica at once.
    #[arg(long, default_value_t = 20, requires = "mqtt")]
    mqtt_receive_maximum: u16,
    /// TLS to the broker: its certificate chain must lead to a CA in this PEM file and name the
    /// broker's HOST as `--mqtt` gives it (without this, plain TCP: keep the broker beside the
    /// gateways).
    #[arg(long, value_name = "PEM FILE", requires = "mqtt")]
    mqtt_ca: Option<PathBuf>,
    /// Retire this client id: unsubscribe, forward what its session still holds, then exit
    /// (a replica taken out of the set for good; see docs/deployment.md).
    #[arg(long, requires = "mqtt")]
    mqtt_leave: bool,
    /// Also take readings over CoAP on this UDP address (confirmable `POST /r/<key>`). CoAP has
    /// no device authentication yet (no DTLS on the device): needs `--insecure-no-auth`.
    #[arg(long, value_name = "UDP ADDR", conflicts_with = "mqtt")]
    coap: Option<SocketAddr>,
    /// CoAP: a verdict within this many milliseconds is piggybacked on the ACK; a later one
    /// follows an empty ACK as a separate response.
    #[arg(long, default_value_t = 1000, requires = "coap")]
    coap_piggyback_ms: u64,
}

/// The MQTT settings, with the password from its file or variable.
fn mqtt_config(args: &Args, broker: &str) -> Result<wary_gateway::mqtt::MqttConfig> {
    let (host, port) = broker.rsplit_once(':').context("--mqtt must be HOST:PORT")?;
    let port: u16 = port.parse().context("--mqtt: bad port")?;
    let client_id = args.mqtt_client_id.as_deref().context("--mqtt needs --mqtt-client-id")?;
    let password = match (&args.mqtt_password_file, &args.mqtt_password_env) {
        (Some(p), _) => std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
        (None, Some(var)) => std::env::var(var).with_context(|| format!("environment variable {var}"))?,
        (None, None) => bail!("--mqtt needs --mqtt-password-file or --mqtt-password-env"),
    };
    let mut c = wary_gateway::mqtt::MqttConfig::new(host, port, client_id, password.trim());
    c.group.clone_from(&args.mqtt_group);
    c.username.clone_from(&args.mqtt_username);
    c.session_expiry_secs = args.mqtt_session_expiry_secs;
    c.receive_maximum = args.mqtt_receive_maximum;
    if let Some(ca) = &args.mqtt_ca {
        c.tls = Some(std::sync::Arc::new(wary_gateway::tls::client_config(ca)?));
    }
    Ok(c)
}

fn split<'a>(spec: &'a str, sep: char, what: &str) -> Result<(HeaderName, &'a str)> {
    let Some((name, rest)) = spec.split_once(sep) else { bail!("{what} must be `NAME{sep}…`") };
    let name = HeaderName::try_from(name.trim()).with_context(|| format!("{what}: bad header name"))?;
    Ok((name, rest.trim()))
}

fn secret(name: HeaderName, value: &str, from: &str) -> Result<StaticHeader> {
    // The value's text is never put into an error: only where it came from.
    let v = HeaderValue::from_str(value.trim())
        .map_err(|_| anyhow::anyhow!("{name}: the value from {from} is not a valid header value"))?;
    Ok(StaticHeader::new(name, v))
}

fn headers(args: &Args) -> Result<Vec<StaticHeader>> {
    let mut out = Vec::new();
    for h in &args.headers {
        let (name, value) = split(h, ':', "--header")?;
        out.push(secret(name, value, "--header")?);
    }
    for h in &args.header_files {
        let (name, path) = split(h, '=', "--header-file")?;
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
        out.push(secret(name, &text, path)?);
    }
    for h in &args.header_envs {
        let (name, var) = split(h, '=', "--header-env")?;
        let text = std::env::var(var).with_context(|| format!("environment variable {var}"))?;
        out.push(secret(name, &text, var)?);
    }
    Ok(out)
}

/// The device-side listener, with a backlog for bursts of connecting devices (the kernel caps
/// it at `net.core.somaxconn`).
fn listen(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket =
        if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    // A restarted replica binds its port again at once, whatever its last connections' state.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(4096)
}

/// `wary-gateway credential new <device id, 16 hex>`: a new token (shown once, for the device)
/// and the credentials file line that admits it.
fn credential(rest: &[String]) -> Result<()> {
    let [verb, device] = rest else { bail!("usage: wary-gateway credential new <device id, 16 hex digits>") };
    if verb != "new" {
        bail!("usage: wary-gateway credential new <device id, 16 hex digits>");
    }
    let id = (device.len() == 16)
        .then(|| u64::from_str_radix(device, 16).ok())
        .flatten()
        .context("the device id must be 16 hex digits")?;
    let (token, line) = Credentials::issue(id);
    println!("token (give it to the device; it is not kept): {token}");
    println!("credentials line (append to the gateway's file): {line}");
    Ok(())
}

fn main() -> Result<()> {
    let argv: Vec<String> = std::env::args().collect();
    if let Some((_, rest)) =
        argv.split_first().and_then(|(_, a)| a.split_first()).filter(|(c, _)| *c == "credential")
    {
        return credential(rest);
    }
    let args = Args::parse();
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = args.threads {
        rt.worker_threads(n.max(1));
    }
    rt.enable_all().build()?.block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    if !args.metrics.ip().is_loopback() {
        bail!("the metrics endpoint is served on loopback only");
    }
    let mut config = Config::new(&args.upstream);
    let up = &mut config.upstream;
    up.legacy = args.legacy;
    up.path = args
        .path
        .clone()
        .unwrap_or_else(|| if args.legacy { "/legacy/readings" } else { "/readings" }.to_owned());
    if !up.path.starts_with('/') {
        bail!("--path must start with `/`");
    }
    up.key_header = HeaderName::try_from(args.key_header.as_str()).context("--key-header")?;
    up.headers = headers(&args)?;
    up.body_check = match (&args.require_content_type, &args.require_json_field) {
        (Some(ct), _) => BodyCheck::ContentType(ct.clone()),
        (_, Some(f)) => BodyCheck::JsonField(f.clone()),
        _ => BodyCheck::None,
    };
    up.attempt_timeout = Duration::from_millis(args.attempt_timeout_ms);
    up.probe_grace = args.probe_grace_ms.map(Duration::from_millis);
    config.queue = args.queue;
    config.workers = args.workers;
    config.max_body = args.max_body;
    config.batch =
        wary_host::batch::Limits { max_items: args.batch_max_items.max(1), max_bytes: args.batch_max_bytes };
    config.admission = Limits { rate_per_sec: args.rate, burst: args.burst, max_devices: args.max_devices };
    config.body_timeout = Duration::from_millis(args.body_timeout_ms);
    config.device_prefix = args.device_prefix;
    config.upstream_pacing = args.upstream_pacing || !args.no_upstream_pacing;
    config.auth = match &args.credentials {
        Some(p) => {
            let c = Credentials::load(p).with_context(|| format!("credentials {}", p.display()))?;
            eprintln!("wary-gateway: {} device credentials", c.len());
            Auth::Bearer(Arc::new(c))
        }
        None => Auth::Open,
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(c), Some(k)) => Some(Arc::new(Tls::load_with(c, k, args.tls_client_ca.as_deref())?)),
        _ => None,
    };
    if let Some(p) = &args.policy {
        let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        config.policy = serde_json::from_str::<PolicySpec>(&text).context("policy spec")?;
    }
    let ledger: Box<dyn Write + Send> = match &args.ledger {
        Some(p) => Box::new(OpenOptions::new().create(true).append(true).open(p)?),
        None => Box::new(std::io::sink()),
    };
    if args.coap.is_some() && !args.insecure_no_auth {
        // Nothing in a plain CoAP datagram says who sent it (docs/coap.md, docs/security.md).
        bail!("--coap has no device authentication (no DTLS or OSCORE yet): it needs --insecure-no-auth");
    }
    let gw = Arc::new(Gateway::start(config, ledger)?);
    if !args.no_metrics {
        let listener = tokio::net::TcpListener::bind(args.metrics).await?;
        eprintln!("wary-gateway: metrics on http://{}/metrics", listener.local_addr()?);
        tokio::spawn(wary_gateway::ingress::serve_metrics(gw.clone(), listener));
    }
    if let Some(broker) = &args.mqtt {
        let ingress = wary_gateway::mqtt::Ingress::start(gw.clone(), &mqtt_config(&args, broker)?);
        if args.mqtt_leave {
            let (quiet, limit) = (Duration::from_secs(2), Duration::from_secs(600));
            return match ingress.leave(quiet, limit).await {
                Ok(()) => {
                    eprintln!("wary-gateway: left the group; the session is empty");
                    Ok(())
                }
                Err(n) => bail!("{n} messages still unacknowledged after {limit:?}; the session keeps them"),
            };
        }
        eprintln!(
            "wary-gateway: taking readings from mqtt://{broker} as a member of group {}",
            args.mqtt_group
        );
        let _ = tokio::signal::ctrl_c().await;
        return Ok(());
    }
    let _coap = match args.coap {
        Some(addr) => {
            let socket =
                tokio::net::UdpSocket::bind(addr).await.with_context(|| format!("binding {addr}"))?;
            let config = wary_gateway::coap::CoapConfig {
                piggyback_wait: Duration::from_millis(args.coap_piggyback_ms),
                ..Default::default()
            };
            let ingress = wary_gateway::coap::Ingress::start(gw.clone(), socket, config)?;
            eprintln!("wary-gateway: coap on coap://{} (no authentication)", ingress.local_addr());
            Some(ingress)
        }
        None => None,
    };
    tokio::spawn(reload_on_hangup(gw.clone(), args.credentials.clone(), tls.clone()));
    let listener = listen(args.listen).with_context(|| format!("binding {}", args.listen))?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    eprintln!("wary-gateway: listening on {scheme}://{}", listener.local_addr()?);
    let serve = async {
        match tls {
            Some(tls) => wary_gateway::ingress::serve_tls(gw.clone(), listener, tls).await,
            None => wary_gateway::ingress::serve(gw.clone(), listener).await,
        }
    };
    tokio::select! {
        () = serve => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}

/// On SIGHUP: the credentials file and the TLS files again. Open connections are untouched;
/// whatever fails to load leaves the old one in force, and says why (never a file's content).
async fn reload_on_hangup(gw: Arc<Gateway>, credentials: Option<PathBuf>, tls: Option<Arc<Tls>>) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hangup) = signal(SignalKind::hangup()) else { return };
    while hangup.recv().await.is_some() {
        if let Some(p) = &credentials {
            match Credentials::load(p) {
                Ok(c) => {
                    eprintln!("wary-gateway: reloaded {} device credentials", c.len());
                    gw.set_credentials(c);
                }
                Err(e) => eprintln!("wary-gateway: credentials not reloaded, the old ones stay: {e}"),
            }
        }
        if let Some(t) = &tls {
            match t.reload() {
                Ok(()) => eprintln!("wary-gateway: reloaded the TLS certificate and key"),
                Err(e) => eprintln!("wary-gateway: TLS not reloaded, the old certificate stays: {e}"),
            }
        }
    }
}

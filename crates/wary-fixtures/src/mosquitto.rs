//! A mosquitto broker for tests and device runs: Debian's `mosquitto` 2.0 (MQTT 5, shared
//! subscriptions) started with a config of our own on 127.0.0.1 only, logins from a password
//! file and an ACL that lets each device publish only under its own topic.
//!
//! - Devices log in with their device id (16 lowercase hex digits) as the username and their
//!   token as the password, and may publish only to `wary/<their id>/readings`
//!   (`pattern write wary/%u/readings`).
//! - The gateway logs in as [`GATEWAY_USER`] and may read `wary/+/readings` (which a shared
//!   subscription `$share/<group>/wary/+/readings` needs).
//! - Anonymous clients are refused.
//! - With [`Settings::tls`], a second listener takes TLS (the certificate chain and key given)
//!   beside the plain one, with the same logins and ACL: devices connect to
//!   [`Broker::tls_port`], checkers and gateways on 127.0.0.1 may keep the plain port.
//!
//! The broker keeps its state in the directory it was started in (`mosquitto.db`, written on a
//! clean stop and every [`Settings::autosave_secs`]), so [`Broker::restart`] brings back the
//! persistent sessions and their queued messages. [`Broker::kill`] is a crash: what was not
//! saved is gone, as on a real broker.
//!
//! The binary is `/usr/sbin/mosquitto` (`xtask`'s `ensure_mosquitto` installs the package).

use std::fmt::Write as _;
use std::fs;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// Where Debian's package puts the broker.
pub const MOSQUITTO: &str = "/usr/sbin/mosquitto";
/// Where Debian's package puts the password-file tool.
pub const MOSQUITTO_PASSWD: &str = "/usr/bin/mosquitto_passwd";
/// The gateway's username on the broker.
pub const GATEWAY_USER: &str = "gateway";
/// The topic a device publishes its readings to.
pub fn readings_topic(device: &str) -> String {
    format!("wary/{device}/readings")
}
/// The filter the gateway's shared subscription covers.
pub const READINGS_FILTER: &str = "wary/+/readings";

/// One login on the broker.
#[derive(Clone, Debug)]
pub struct Login {
    /// The username: a device id (16 lowercase hex digits) or [`GATEWAY_USER`].
    pub user: String,
    /// The password (a device's token).
    pub password: String,
}

impl Login {
    /// A login.
    pub fn new(user: impl Into<String>, password: impl Into<String>) -> Self {
        Self { user: user.into(), password: password.into() }
    }
}

/// The broker's settings that the tests vary.
#[derive(Clone, Debug)]
pub struct Settings {
    /// `max_queued_messages`: QoS 1 messages queued per session beyond those in flight (0: no
    /// limit). mosquitto's default is 1,000; past it a message to that session is dropped
    /// although its publisher got PUBACK 0x00.
    pub max_queued_messages: u32,
    /// `max_inflight_messages`: QoS 1 messages in flight to one client (mosquitto's default 20).
    pub max_inflight_messages: u16,
    /// `autosave_interval` in seconds (0: save only on a clean stop).
    pub autosave_secs: u32,
    /// `persistent_client_expiration`, e.g. `"1h"` (None: sessions never expire).
    pub session_expiry: Option<String>,
    /// `max_keepalive`: a client asking for a longer keep alive gets this one back as the
    /// CONNACK's Server Keep Alive (MQTT 5), and is dropped after 1.5 times it of silence.
    /// mosquitto 2.0.11 refuses a value under 10.
    pub max_keepalive: Option<u16>,
    /// A TLS listener as well: the server's certificate chain (PEM, leaf first) and its key
    /// (PEM) files.
    pub tls: Option<(PathBuf, PathBuf)>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            max_queued_messages: 1_000,
            max_inflight_messages: 20,
            autosave_secs: 1,
            session_expiry: None,
            max_keepalive: None,
            tls: None,
        }
    }
}

/// A running broker; killed when dropped.
pub struct Broker {
    dir: PathBuf,
    port: u16,
    tls_port: Option<u16>,
    child: Option<Child>,
}

impl Broker {
    /// Writes the password file, the ACL and the config into `dir` (created if missing) and
    /// starts the broker on a free port of 127.0.0.1; returns once it accepts connections.
    pub fn start(dir: &Path, logins: &[Login], settings: &Settings) -> Result<Self> {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let dir = dir.canonicalize()?;
        write_passwords(&dir, logins)?;
        fs::write(dir.join("acl"), acl())?;
        let port = free_port()?;
        let tls_port = settings.tls.as_ref().map(|_| free_port()).transpose()?;
        fs::write(dir.join("mosquitto.conf"), config(&dir, port, tls_port, settings))?;
        let mut broker = Self { dir, port, tls_port, child: None };
        broker.spawn()?;
        Ok(broker)
    }

    /// The port on 127.0.0.1 (the QEMU guest reaches it at 10.0.2.2 on the same port).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The TLS listener's port on 127.0.0.1, when [`Settings::tls`] asked for one.
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }

    /// The directory holding the config, the persistence file and `mosquitto.log`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stops the broker cleanly (SIGTERM: it saves its sessions and queues) and waits for it.
    pub fn stop(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            let pid = child.id().to_string();
            let _ = Command::new("kill").args(["-TERM", &pid]).status();
            let end = Instant::now() + Duration::from_secs(10);
            while Instant::now() < end {
                if child.try_wait()?.is_some() {
                    return Ok(());
                }
                thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
            bail!("mosquitto did not stop within 10 s of SIGTERM");
        }
        Ok(())
    }

    /// Kills the broker (SIGKILL): a crash, losing what it had not saved.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the broker again on the same port, with the same config and saved state.
    pub fn restart(&mut self) -> Result<()> {
        self.stop()?;
        self.spawn()
    }

    fn spawn(&mut self) -> Result<()> {
        let log = fs::OpenOptions::new().create(true).append(true).open(self.dir.join("mosquitto.log"))?;
        let child = Command::new(MOSQUITTO)
            .arg("-c")
            .arg(self.dir.join("mosquitto.conf"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {MOSQUITTO} (is the Debian package mosquitto installed?)"))?;
        self.child = Some(child);
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            let listening = |port: u16| TcpStream::connect(("127.0.0.1", port)).is_ok();
            if listening(self.port) && self.tls_port.is_none_or(listening) {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!("mosquitto exited with {status}; see {}", self.dir.join("mosquitto.log").display());
            }
            thread::sleep(Duration::from_millis(20));
        }
        bail!("mosquitto did not listen on 127.0.0.1:{} within 10 s", self.port)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
    }
}

fn write_passwords(dir: &Path, logins: &[Login]) -> Result<()> {
    let file = dir.join("passwd");
    let _ = fs::remove_file(&file);
    fs::write(&file, "")?;
    for login in logins {
        let status = Command::new(MOSQUITTO_PASSWD)
            .arg("-b")
            .arg(&file)
            .args([&login.user, &login.password])
            .stdout(Stdio::null())
            .status()
            .with_context(|| format!("running {MOSQUITTO_PASSWD}"))?;
        if !status.success() {
            bail!("{MOSQUITTO_PASSWD} failed for user {}", login.user);
        }
    }
    Ok(())
}

fn acl() -> String {
    format!("pattern write wary/%u/readings\n\nuser {GATEWAY_USER}\ntopic read {READINGS_FILTER}\n")
}

fn config(dir: &Path, port: u16, tls_port: Option<u16>, settings: &Settings) -> String {
    let mut c = String::new();
    let d = dir.display();
    // Run as whoever started it (as root, mosquitto would otherwise switch to user `mosquitto`,
    // which cannot write the test's directory).
    let _ = writeln!(c, "user {}", std::env::var("USER").unwrap_or_else(|_| "root".to_owned()));
    let _ = writeln!(c, "per_listener_settings false");
    let _ = writeln!(c, "allow_anonymous false");
    let _ = writeln!(c, "password_file {d}/passwd");
    let _ = writeln!(c, "acl_file {d}/acl");
    let _ = writeln!(c, "listener {port} 127.0.0.1");
    if let (Some(tls_port), Some((cert, key))) = (tls_port, &settings.tls) {
        // The options after a `listener` line are that listener's.
        let _ = writeln!(c, "listener {tls_port} 127.0.0.1");
        let _ = writeln!(c, "certfile {}", cert.display());
        let _ = writeln!(c, "keyfile {}", key.display());
    }
    let _ = writeln!(c, "persistence true");
    let _ = writeln!(c, "persistence_location {d}/");
    let _ = writeln!(c, "persistence_file mosquitto.db");
    if settings.autosave_secs > 0 {
        let _ = writeln!(c, "autosave_interval {}", settings.autosave_secs);
    }
    let _ = writeln!(c, "max_queued_messages {}", settings.max_queued_messages);
    let _ = writeln!(c, "max_inflight_messages {}", settings.max_inflight_messages);
    if let Some(seconds) = settings.max_keepalive {
        let _ = writeln!(c, "max_keepalive {seconds}");
    }
    if let Some(expiry) = &settings.session_expiry {
        let _ = writeln!(c, "persistent_client_expiration {expiry}");
    }
    let _ = writeln!(c, "log_dest stderr");
    let _ = writeln!(c, "log_type error\nlog_type warning\nlog_type notice\nlog_type information");
    let _ = writeln!(c, "connection_messages true");
    c
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn pub_as(port: u16, login: &Login, topic: &str) -> bool {
        Command::new("mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-V", "mqttv5", "-q", "1"])
            .args(["-u", &login.user, "-P", &login.password, "-t", topic, "-m", "{}"])
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }

    /// Logins are checked and anonymous clients refused; a device publishes only under its own
    /// topic (mosquitto 2.0 answers a publish the ACL denies with PUBACK 0x87 and drops it; the check reads
    /// what the gateway's login receives).
    #[test]
    fn logins_and_topics_are_enforced() -> Result<()> {
        if !Path::new(MOSQUITTO).exists() {
            eprintln!("skipped: {MOSQUITTO} is not installed (cargo xtask ci installs it)");
            return Ok(());
        }
        let dir = std::env::temp_dir().join(format!("wary-mosquitto-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let a = Login::new("00000000000000a1", "a".repeat(64));
        let b = Login::new("00000000000000b2", "b".repeat(64));
        let gw = Login::new(GATEWAY_USER, "g".repeat(64));
        let broker = Broker::start(&dir, &[a.clone(), b.clone(), gw.clone()], &Settings::default())?;
        let port = broker.port();
        let sub = Command::new("mosquitto_sub")
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-V", "mqttv5", "-q", "1", "-v"])
            .args(["-u", &gw.user, "-P", &gw.password, "-t", READINGS_FILTER, "-W", "3"])
            .stdout(Stdio::piped())
            .spawn()?;
        thread::sleep(Duration::from_millis(500));
        assert!(pub_as(port, &a, &readings_topic(&a.user)), "a device publishes under its topic");
        let _ = pub_as(port, &a, &readings_topic(&b.user));
        let wrong = Login::new(a.user.clone(), "x".repeat(64));
        assert!(!pub_as(port, &wrong, &readings_topic(&a.user)), "a wrong password is refused");
        let out = sub.wait_with_output()?;
        let seen = String::from_utf8_lossy(&out.stdout);
        assert_eq!(seen.lines().filter(|l| l.starts_with(&readings_topic(&a.user))).count(), 1, "{seen}");
        assert_eq!(seen.lines().filter(|l| l.starts_with(&readings_topic(&b.user))).count(), 0, "{seen}");
        drop(broker);
        let _ = fs::remove_dir_all(&dir);
        Ok(())
    }
}

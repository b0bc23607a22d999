//! Check beds: run a box's `eval:` checks in a disposable container.
//!
//! A bed is a container of the box image (built with `--dev-local-pkg`,
//! reusing every cached node). When the box's candies define services the
//! bed runs the box's init (supervisord) so `service:` checks see them;
//! otherwise it just sleeps. Build-scope checks run inside it as the box
//! user; deploy-scope checks, host-side checks and checks needing deploy-time
//! variables are reported as skipped with the reason. A bed whose image key
//! and check definitions are unchanged and whose last result was all-pass is
//! reported as cached without starting a container.

use charly_cache::{NodeKey, Record, Store};
use charly_rules::Diagnostic;
use charly_rules::check::{
    Check, CheckKind, CheckScope, Matcher, deploy_only_var, expand_user_vars, parse_checks,
};
use charly_rules::load::Project;
use charly_rules::resolve::ResolvedBox;
use charly_rules::sh;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Output of a command run in a bed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecOutput {
    /// Exit status (-1 when killed).
    pub status: i32,
    /// stdout.
    pub stdout: String,
    /// stderr.
    pub stderr: String,
}

/// Where beds run (podman in practice).
pub trait BedHost: Send + Sync {
    /// Starts a container of `image` named `name` running `cmd` (entrypoint
    /// replaced) as `user`; returns its id.
    fn start(&self, image: &str, name: &str, user: &str, cmd: &[String]) -> Result<String, String>;
    /// Runs a shell script inside as `user`.
    fn exec(
        &self,
        id: &str,
        user: &str,
        script: &str,
        timeout: Duration,
    ) -> Result<ExecOutput, String>;
    /// Removes the container.
    fn remove(&self, id: &str);
}

/// How a check ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// It held.
    Pass,
    /// It did not.
    Fail,
    /// Not run here (the reason says why).
    Skip,
}

/// One check's result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckResult {
    /// Check id.
    pub id: String,
    /// Candy or box it belongs to (`candy:redis`, `box:jupyter`).
    pub owner: String,
    /// The outcome.
    pub outcome: Outcome,
    /// Why it was skipped, or what failed.
    pub reason: Option<String>,
    /// What was expected (failures).
    pub expected: Option<String>,
    /// What was found (failures).
    pub actual: Option<String>,
    /// Time spent.
    pub duration_ms: u64,
}

/// One bed's results.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BedReport {
    /// Box.
    pub box_name: String,
    /// Taken from an earlier all-pass run without starting a container.
    pub cached: bool,
    /// Results in candy order (the box's own last).
    pub checks: Vec<CheckResult>,
    /// A problem that stopped the bed (image missing, container failed).
    pub error: Option<String>,
}

impl BedReport {
    /// Counts (pass, fail, skip).
    pub fn counts(&self) -> (usize, usize, usize) {
        let c = |o: Outcome| self.checks.iter().filter(|r| r.outcome == o).count();
        (c(Outcome::Pass), c(Outcome::Fail), c(Outcome::Skip))
    }

    /// Whether everything that ran passed.
    pub fn ok(&self) -> bool {
        self.error.is_none() && self.counts().1 == 0
    }
}

/// The checks of a box: its candies' (base chain first, in order), then its own.
pub fn box_checks(
    p: &Project,
    b: &ResolvedBox,
    diags: &mut Vec<Diagnostic>,
) -> Vec<(String, Check)> {
    let mut out = Vec::new();
    for k in b.provided.iter().chain(b.candies.iter()) {
        let c = &p.candies[k];
        if let Some(e) = &c.def.eval {
            let owner = format!("candy:{}", c.name);
            for ch in parse_checks(&e.0, &owner, diags) {
                out.push((owner.clone(), ch));
            }
        }
    }
    let def = p.namespaces.iter().find_map(|n| {
        n.boxes
            .values()
            .find(|x| n.qualify(&x.name) == b.name)
            .map(|x| &x.def)
    });
    if let Some(e) = def.and_then(|d| d.eval.as_ref()) {
        let owner = format!("box:{}", b.name);
        for ch in parse_checks(&e.0, &owner, diags) {
            out.push((owner.clone(), ch));
        }
    }
    out
}

/// The key of a bed's result: the image key and every check definition.
pub fn bed_key(image_key: &NodeKey, checks: &[(String, Check)]) -> NodeKey {
    let mut h = blake3::Hasher::new();
    h.update(b"charly-check-bed-v1\0");
    h.update(image_key.as_bytes());
    for (owner, c) in checks {
        h.update(owner.as_bytes());
        h.update(b"\0");
        h.update(c.definition.to_string().as_bytes());
        h.update(b"\0");
    }
    NodeKey::from_bytes(*h.finalize().as_bytes())
}

/// A bed to run.
pub struct Bed<'a> {
    /// The box.
    pub b: &'a ResolvedBox,
    /// Its image reference.
    pub image: String,
    /// Its checks with owners.
    pub checks: Vec<(String, Check)>,
    /// The init command to run (services), else the bed sleeps.
    pub init: Option<Vec<String>>,
    /// The box's primary format (for package checks).
    pub format: String,
}

/// A bed's report when it needs no container: it has no checks, or (not
/// `force`) its image and checks are unchanged since an all-pass run, whose
/// report the store holds. None: [`run_bed`] starts a container (and the
/// image must be in podman first).
pub fn bed_without_container(
    store: &Store,
    image_key: &NodeKey,
    bed: &Bed<'_>,
    force: bool,
) -> Option<BedReport> {
    if bed.checks.is_empty() {
        return Some(BedReport {
            box_name: bed.b.name.clone(),
            cached: false,
            checks: Vec::new(),
            error: None,
        });
    }
    let key = bed_key(image_key, &bed.checks);
    if !force
        && let Ok(Some(rec)) = store.get_record(&key)
        && let Ok(prev) = serde_json::from_value::<BedReport>(rec.meta.clone())
        && prev.ok()
    {
        return Some(BedReport {
            cached: true,
            ..prev
        });
    }
    None
}

/// Runs one bed (or reports the cached result).
pub fn run_bed(
    host: &dyn BedHost,
    store: &Store,
    image_key: &NodeKey,
    bed: &Bed<'_>,
    keep: bool,
    force: bool,
) -> BedReport {
    if let Some(r) = bed_without_container(store, image_key, bed, force) {
        return r;
    }
    let key = bed_key(image_key, &bed.checks);
    let name = format!(
        "charly-bed-{}-{}",
        bed.b.name.replace('.', "-"),
        &key.to_hex()[..12]
    );
    host.remove(&name);
    let user = format!("{}:{}", bed.b.user.uid, bed.b.user.gid);
    let cmd: Vec<String> = bed
        .init
        .clone()
        .unwrap_or_else(|| vec!["sleep".into(), "infinity".into()]);
    let report = match host.start(&bed.image, &name, &user, &cmd) {
        Err(e) => BedReport {
            box_name: bed.b.name.clone(),
            cached: false,
            checks: Vec::new(),
            error: Some(format!("starting a bed of {}: {e}", bed.image)),
        },
        Ok(id) => {
            let checks = bed
                .checks
                .iter()
                .map(|(owner, c)| run_check(host, &id, bed, owner, c))
                .collect();
            if !keep {
                host.remove(&id);
            }
            BedReport {
                box_name: bed.b.name.clone(),
                cached: false,
                checks,
                error: None,
            }
        }
    };
    if report.ok() {
        let rec = Record {
            node_id: format!("check-bed:{}", bed.b.name),
            kind: "check-bed".into(),
            outputs: BTreeMap::new(),
            duration_ms: report.checks.iter().map(|c| c.duration_ms).sum(),
            producer: "charly".into(),
            key_inputs: serde_json::json!({"image": image_key.to_hex(), "checks": bed.checks.len()}),
            created_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            meta: serde_json::to_value(&report).unwrap_or_default(),
        };
        let _ = store.put_record(&key, &rec);
    }
    report
}

fn skip(owner: &str, c: &Check, reason: impl Into<String>) -> CheckResult {
    CheckResult {
        id: c.id.clone(),
        owner: owner.to_string(),
        outcome: Outcome::Skip,
        reason: Some(reason.into()),
        expected: None,
        actual: None,
        duration_ms: 0,
    }
}

fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let (num, unit) = s.split_at(
        s.find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(s.len()),
    );
    let n: f64 = num.parse().ok()?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return None,
    };
    Some(Duration::from_secs_f64(secs))
}

fn run_check(host: &dyn BedHost, id: &str, bed: &Bed<'_>, owner: &str, c: &Check) -> CheckResult {
    let u = &bed.b.user;
    if let CheckKind::Unsupported { plugin } = &c.kind {
        return skip(owner, c, unsupported_reason(plugin));
    }
    if c.scope == CheckScope::Deploy {
        return skip(
            owner,
            c,
            "deploy-scope check: runs against a deployment (charly bundle), not in a bed",
        );
    }
    if !c.in_container {
        return skip(
            owner,
            c,
            "in_container: false: runs on the host, not in a bed",
        );
    }
    if let Some(d) = c.exclude_distro.iter().find(|d| {
        bed.b
            .tags
            .iter()
            .any(|t| t == *d || t.split(':').next() == Some(d.as_str()))
    }) {
        return skip(owner, c, format!("excluded on {d}"));
    }
    let subject_text = match &c.kind {
        CheckKind::File { path, .. } => path.clone(),
        CheckKind::Command { command, .. } => command.clone(),
        CheckKind::Package { name, .. } | CheckKind::Service { name, .. } => name.clone(),
        CheckKind::Addr { addr, .. } => addr.clone(),
        CheckKind::Other { subject, .. } => {
            return skip(owner, c, format!("a {subject} check needs a deployment"));
        }
        CheckKind::Unsupported { plugin } => return skip(owner, c, unsupported_reason(plugin)),
    };
    if let Some(v) = deploy_only_var(&subject_text) {
        return skip(owner, c, format!("needs the deploy-time variable ${{{v}}}"));
    }
    let user = format!("{}:{}", u.uid, u.gid);
    let t = Instant::now();
    let duration = |key: &str| {
        c.definition
            .get(key)
            .and_then(|v| v.as_str())
            .and_then(parse_duration)
    };
    let eventually = duration("eventually").unwrap_or(match c.kind {
        // Services start asynchronously under the init.
        CheckKind::Service { .. } | CheckKind::Addr { .. } => Duration::from_secs(15),
        _ => Duration::ZERO,
    });
    let interval = duration("retry_interval").unwrap_or(Duration::from_millis(500));
    let timeout = duration("timeout").unwrap_or(Duration::from_secs(120));
    loop {
        let r = attempt(host, id, bed, &user, owner, c, timeout);
        if r.outcome != Outcome::Fail || t.elapsed() >= eventually {
            return CheckResult {
                duration_ms: t.elapsed().as_millis() as u64,
                ..r
            };
        }
        std::thread::sleep(interval);
    }
}

fn attempt(
    host: &dyn BedHost,
    id: &str,
    bed: &Bed<'_>,
    user: &str,
    owner: &str,
    c: &Check,
    timeout: Duration,
) -> CheckResult {
    let a = Attempt {
        host,
        id,
        bed,
        user,
        owner,
        c,
        timeout,
    };
    match &c.kind {
        CheckKind::File {
            path,
            exists,
            mode,
            filetype,
            contains,
        } => a.file(
            path,
            *exists,
            mode.as_deref(),
            filetype.as_deref(),
            contains,
        ),
        CheckKind::Command {
            command,
            exit_status,
            stdout,
            stderr,
        } => a.command(command, *exit_status, stdout, stderr),
        CheckKind::Package {
            name,
            installed,
            package_map,
        } => a.package(name, *installed, package_map),
        CheckKind::Service { name, running } => a.service(name, *running),
        CheckKind::Addr { addr, reachable } => a.addr(addr, *reachable),
        CheckKind::Other { subject, .. } => {
            skip(owner, c, format!("a {subject} check needs a deployment"))
        }
        CheckKind::Unsupported { plugin } => skip(owner, c, unsupported_reason(plugin)),
    }
}

/// One attempt of one check in a bed.
struct Attempt<'a> {
    host: &'a dyn BedHost,
    id: &'a str,
    bed: &'a Bed<'a>,
    /// `uid:gid` the scripts run as.
    user: &'a str,
    owner: &'a str,
    c: &'a Check,
    timeout: Duration,
}

impl Attempt<'_> {
    fn fail(&self, reason: &str, expected: String, actual: String) -> CheckResult {
        CheckResult {
            id: self.c.id.clone(),
            owner: self.owner.to_string(),
            outcome: Outcome::Fail,
            reason: Some(reason.to_string()),
            expected: Some(expected),
            actual: Some(actual),
            duration_ms: 0,
        }
    }

    fn pass(&self) -> CheckResult {
        CheckResult {
            id: self.c.id.clone(),
            owner: self.owner.to_string(),
            outcome: Outcome::Pass,
            reason: None,
            expected: None,
            actual: None,
            duration_ms: 0,
        }
    }

    fn run(&self, script: &str) -> Result<ExecOutput, String> {
        self.host.exec(self.id, self.user, script, self.timeout)
    }

    /// `$USER` and `$HOME` of the box's user expanded.
    fn exp(&self, s: &str) -> String {
        let u = &self.bed.b.user;
        expand_user_vars(s, &u.name, &u.home)
    }

    /// A path exists (or not), with a mode, a type and contents.
    fn file(
        &self,
        path: &str,
        exists: Option<bool>,
        mode: Option<&str>,
        filetype: Option<&str>,
        contains: &[String],
    ) -> CheckResult {
        let path = self.exp(path);
        let out = match self.run(&format!(
            "stat -c '%F|%a' {} 2>/dev/null || echo missing",
            sh::quote(&path)
        )) {
            Ok(o) => o,
            Err(e) => return self.fail("could not run stat in the bed", "a result".into(), e),
        };
        let line = out.stdout.trim().to_string();
        let present = line != "missing";
        let want_present = exists.unwrap_or(true);
        if present != want_present {
            return self.fail(
                "existence",
                if want_present {
                    format!("{path} exists")
                } else {
                    format!("{path} absent")
                },
                if present {
                    format!("{path} exists ({line})")
                } else {
                    format!("{path} does not exist")
                },
            );
        }
        if !present {
            return self.pass();
        }
        let (kind, actual_mode) = line.split_once('|').unwrap_or((&line, ""));
        if let Some(m) = mode {
            let want = m.trim_start_matches('0');
            if actual_mode.trim_start_matches('0') != want {
                return self.fail("mode", format!("mode {m}"), format!("mode 0{actual_mode}"));
            }
        }
        if let Some(ft) = filetype {
            let ok = match ft {
                "directory" | "dir" => kind == "directory",
                "file" | "regular" => kind.starts_with("regular"),
                "symlink" | "link" => kind == "symbolic link",
                other => kind == other,
            };
            if !ok {
                return self.fail("file type", ft.to_string(), kind.to_string());
            }
        }
        if !contains.is_empty() {
            let content = match self.run(&format!("cat {}", sh::quote(&path))) {
                Ok(o) => o.stdout,
                Err(e) => return self.fail("could not read the file", "its content".into(), e),
            };
            for want in contains {
                if !content.contains(want.as_str()) {
                    let shown: String = content.chars().take(200).collect();
                    return self.fail("content", format!("contains {want:?}"), shown);
                }
            }
        }
        self.pass()
    }

    /// A command run as the box's user in its home: its exit status and
    /// what its output contains or matches.
    fn command(
        &self,
        command: &str,
        exit_status: Option<i64>,
        stdout: &[Matcher],
        stderr: &[Matcher],
    ) -> CheckResult {
        let u = &self.bed.b.user;
        let script = format!(
            "export HOME={home} USER={user}; cd {home} 2>/dev/null || true; if command -v bash >/dev/null 2>&1; then exec bash -c {cmd}; else exec sh -c {cmd}; fi",
            home = sh::quote(&u.home),
            user = sh::quote(&u.name),
            cmd = sh::quote(&self.exp(command))
        );
        let out = match self.run(&script) {
            Ok(o) => o,
            Err(e) => return self.fail("could not run the command", "it to run".into(), e),
        };
        let want_status = exit_status.or(if stdout.is_empty() && stderr.is_empty() {
            Some(0)
        } else {
            None
        });
        if let Some(w) = want_status
            && i64::from(out.status) != w
        {
            let tail: String = out
                .stderr
                .chars()
                .rev()
                .take(300)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            return self.fail(
                "exit status",
                format!("exit status {w}"),
                format!("exit status {} (stderr: {})", out.status, tail.trim()),
            );
        }
        for (stream, text, ms) in [
            ("stdout", &out.stdout, stdout),
            ("stderr", &out.stderr, stderr),
        ] {
            for m in ms {
                let (ok, want) = match m {
                    Matcher::Contains(s) => (
                        text.contains(s.as_str()),
                        format!("{stream} contains {s:?}"),
                    ),
                    Matcher::Matches(r) => match regex::Regex::new(r) {
                        Ok(re) => (re.is_match(text), format!("{stream} matches /{r}/")),
                        Err(e) => {
                            return self.fail(
                                "invalid regular expression",
                                r.clone(),
                                e.to_string(),
                            );
                        }
                    },
                };
                if !ok {
                    let shown: String = text.chars().take(300).collect();
                    return self.fail(stream, want, shown);
                }
            }
        }
        self.pass()
    }

    /// A package is installed (or not), under its name for the bed's
    /// distro.
    fn package(
        &self,
        name: &str,
        installed: bool,
        package_map: &BTreeMap<String, String>,
    ) -> CheckResult {
        let pkg = self
            .bed
            .b
            .tags
            .iter()
            .find_map(|t| {
                package_map
                    .get(t)
                    .or_else(|| package_map.get(t.split(':').next().unwrap_or("")))
            })
            .cloned()
            .unwrap_or_else(|| name.to_string());
        let query = match self.bed.format.as_str() {
            "deb" => format!(
                "dpkg-query -W -f='${{Status}}' {} 2>/dev/null | grep -q 'install ok installed'",
                sh::quote(&pkg)
            ),
            "rpm" => format!("rpm -q {} >/dev/null 2>&1", sh::quote(&pkg)),
            "pac" => format!("pacman -Q {} >/dev/null 2>&1", sh::quote(&pkg)),
            other => {
                return skip(
                    self.owner,
                    self.c,
                    format!("no package query for format `{other}`"),
                );
            }
        };
        let said = |yes: bool| {
            let state = if yes { "installed" } else { "not installed" };
            format!("{pkg} {state}")
        };
        match self.run(&query) {
            Ok(o) if (o.status == 0) == installed => self.pass(),
            Ok(o) => self.fail("package", said(installed), said(o.status == 0)),
            Err(e) => self.fail("could not query packages", pkg, e),
        }
    }

    /// A service of the bed's init is running (or not).
    fn service(&self, name: &str, running: bool) -> CheckResult {
        if self.bed.init.is_none() {
            return skip(
                self.owner,
                self.c,
                "the box runs no init in a bed (no services of its own)",
            );
        }
        match self.run(&format!(
            "supervisorctl -c /etc/supervisord.conf status {} 2>&1",
            sh::quote(name)
        )) {
            Ok(o) if o.stdout.contains("RUNNING") == running => self.pass(),
            Ok(o) => {
                let state = if running { "RUNNING" } else { "not running" };
                self.fail(
                    "service",
                    format!("{name} {state}"),
                    o.stdout.trim().to_string(),
                )
            }
            Err(e) => self.fail("could not ask the init", name.to_string(), e),
        }
    }

    /// A TCP address answers (or not) from inside the bed.
    fn addr(&self, addr: &str, reachable: bool) -> CheckResult {
        let script = match addr_script(addr) {
            Ok(s) => s,
            Err(e) => return self.fail("address", "host:port".into(), e),
        };
        let said = |open: bool| format!("{addr} {}", if open { "reachable" } else { "closed" });
        match self.run(&script) {
            Ok(o) if (o.status == 0) == reachable => self.pass(),
            Ok(_) => self.fail("address", said(reachable), said(!reachable)),
            Err(e) => self.fail("could not connect", addr.to_string(), e),
        }
    }
}

/// The script that connects to `host:port` (bash's `/dev/tcp`, else `nc`):
/// the port a number, the host a name or an address, both passed as
/// quoted arguments, never as script text.
fn addr_script(addr: &str) -> Result<String, String> {
    let Some((host, port)) = addr.rsplit_once(':') else {
        return Err(format!("`{addr}` is not host:port"));
    };
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if port.parse::<u16>().is_err() {
        return Err(format!(
            "`{addr}`: the port `{port}` is not a number up to 65535"
        ));
    }
    let host_ok = !host.is_empty()
        && !host.starts_with('-')
        && host
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '.' | '-' | ':' | '_'));
    if !host_ok {
        return Err(format!(
            "`{addr}`: the host `{host}` is not a host name or an IP address"
        ));
    }
    Ok(format!(
        "if command -v bash >/dev/null 2>&1; then bash -c 'exec 3<>\"/dev/tcp/$0/$1\"' {h} {p} 2>/dev/null; else nc -z {h} {p} 2>/dev/null; fi",
        h = sh::quote(host),
        p = sh::quote(port),
    ))
}

/// Why a `plugin: <word>` check charly has no runner for is not run.
fn unsupported_reason(plugin: &str) -> String {
    format!("plugin `{plugin}` is not supported by charly: no runner for it, the check is not run")
}

/// JUnit XML for CI (one test suite per bed).
pub fn junit(reports: &[BedReport]) -> String {
    fn esc(s: &str) -> String {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&quot;")
    }
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites>\n");
    for r in reports {
        let (p, f, s) = r.counts();
        let errors = usize::from(r.error.is_some());
        x.push_str(&format!(
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{f}\" errors=\"{errors}\" skipped=\"{s}\">\n",
            esc(&r.box_name),
            p + f + s
        ));
        if let Some(e) = &r.error {
            x.push_str(&format!(
                "    <testcase name=\"bed\" classname=\"{}\"><error message=\"{}\"/></testcase>\n",
                esc(&r.box_name),
                esc(e)
            ));
        }
        for c in &r.checks {
            let class = format!("{}.{}", r.box_name, c.owner);
            x.push_str(&format!(
                "    <testcase name=\"{}\" classname=\"{}\" time=\"{:.3}\">",
                esc(&c.id),
                esc(&class),
                c.duration_ms as f64 / 1000.0
            ));
            match c.outcome {
                Outcome::Pass => {}
                Outcome::Skip => x.push_str(&format!(
                    "<skipped message=\"{}\"/>",
                    esc(c.reason.as_deref().unwrap_or(""))
                )),
                Outcome::Fail => x.push_str(&format!(
                    "<failure message=\"{}\">expected: {}\nactual: {}</failure>",
                    esc(c.reason.as_deref().unwrap_or("")),
                    esc(c.expected.as_deref().unwrap_or("")),
                    esc(c.actual.as_deref().unwrap_or(""))
                )),
            }
            x.push_str("</testcase>\n");
        }
        x.push_str("  </testsuite>\n");
    }
    x.push_str("</testsuites>\n");
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs an address check's script with this machine's `sh`.
    fn run_addr(addr: &str) -> Result<i32, String> {
        let script = addr_script(addr)?;
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&script)
            .output()
            .map_err(|e| e.to_string())?;
        Ok(out.status.code().unwrap_or(-1))
    }

    /// An `addr:` value reaches the script only as quoted arguments: one
    /// that tries to end the quoting is refused with a reason, or passed as
    /// data (nothing it says runs); a real listener answers, a closed port
    /// does not.
    #[test]
    fn an_address_is_data_not_script() {
        let dir = tempfile::tempdir().expect("tmp");
        let marker = dir.path().join("ran");
        let m = marker.display();
        for hostile in [
            format!("127.0.0.1:1'; touch {m}; '"),
            format!("127.0.0.1'; touch {m}; echo ':80"),
            format!("$(touch {m}):80"),
            format!("`touch {m}`:80"),
            "-oProxyCommand=x:80".to_string(),
            "127.0.0.1:99999".to_string(),
            "no-port".to_string(),
        ] {
            let e = run_addr(&hostile).expect_err(&hostile);
            assert!(e.contains("not a") || e.contains("not host:port"), "{e}");
        }
        assert!(!marker.exists(), "an address ran as a script");
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        let port = l.local_addr().expect("addr").port();
        assert_eq!(run_addr(&format!("127.0.0.1:{port}")), Ok(0));
        assert_eq!(run_addr(&format!("localhost:{port}")), Ok(0));
        drop(l);
        assert_ne!(run_addr(&format!("127.0.0.1:{port}")), Ok(0));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5s"), Some(Duration::from_secs(5)));
        assert_eq!(parse_duration("90"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("soon"), None);
    }

    #[test]
    fn junit_escapes_and_counts() {
        let r = BedReport {
            box_name: "b".into(),
            cached: false,
            error: None,
            checks: vec![
                CheckResult {
                    id: "ok".into(),
                    owner: "candy:a".into(),
                    outcome: Outcome::Pass,
                    reason: None,
                    expected: None,
                    actual: None,
                    duration_ms: 5,
                },
                CheckResult {
                    id: "bad<1>".into(),
                    owner: "candy:a".into(),
                    outcome: Outcome::Fail,
                    reason: Some("mode".into()),
                    expected: Some("mode 0755".into()),
                    actual: Some("mode 0644".into()),
                    duration_ms: 5,
                },
                CheckResult {
                    id: "s".into(),
                    owner: "box:b".into(),
                    outcome: Outcome::Skip,
                    reason: Some("deploy & co".into()),
                    expected: None,
                    actual: None,
                    duration_ms: 0,
                },
            ],
        };
        let x = junit(&[r]);
        assert!(x.contains("tests=\"3\" failures=\"1\" errors=\"0\" skipped=\"1\""));
        assert!(x.contains("name=\"bad&lt;1&gt;\""));
        assert!(x.contains("expected: mode 0755\nactual: mode 0644"));
        assert!(x.contains("<skipped message=\"deploy &amp; co\"/>"));
    }
}

//! File operations as POSIX shell scripts, for hosts that can only run
//! commands (SSH) or must elevate with `sudo -n` (a non-root local login
//! writing system files). Every script maps target paths through the
//! host's root, exits with a distinct status for "absent" and "not empty",
//! and writes atomically (temp file in the same directory, then `mv`).

use crate::host::{Cmd, CmdOutput, FileAttrs, Host, HostError, Stat, parse_stat_output};
use charly_rules::sh;

fn io_err(host: &dyn Host, op: &str, path: &str, out: &CmdOutput) -> HostError {
    HostError::Io {
        host: host.describe(),
        op: op.into(),
        path: path.into(),
        message: format!("exit {}: {}", out.status, out.stderr_tail()),
    }
}

/// Target paths are absolute, without `..` or `.` components: a path that
/// climbs is refused before any script runs (the guest's root is `/`, but
/// `..` games are still refused).
fn check(host: &dyn Host, op: &str, path: &str) -> Result<(), HostError> {
    charly_files::fsroot::target_rel(path)
        .map(drop)
        .map_err(|e| HostError::Io {
            host: host.describe(),
            op: op.into(),
            path: path.into(),
            message: e.to_string(),
        })
}

/// Reads a file with `cat` (exit 3: absent).
pub fn read_file(
    host: &mut dyn Host,
    path: &str,
    privileged: bool,
) -> Result<Option<Vec<u8>>, HostError> {
    check(host, "read", path)?;
    let p = sh::quote_min(&host.real(path));
    let script = format!(
        "if [ -f {p} ]; then exec cat -- {p}; elif [ -e {p} ] || [ -L {p} ]; then echo 'not a regular file' >&2; exit 4; else exit 3; fi"
    );
    let out = host.run(&Cmd::sh(script).privileged(privileged))?;
    match out.status {
        0 => Ok(Some(out.stdout)),
        3 => Ok(None),
        _ => Err(io_err(host, "read", path, &out)),
    }
}

/// Writes a file atomically: content on stdin into a temp file beside the
/// destination, mode and owner set, then renamed over it.
pub fn write_file(
    host: &mut dyn Host,
    path: &str,
    data: &[u8],
    attrs: &FileAttrs,
) -> Result<(), HostError> {
    check(host, "write", path)?;
    let real = host.real(path);
    let dir = crate::host::parent(&real).unwrap_or("/").to_string();
    let mut script = format!(
        "set -e\nt=$(mktemp {}/.charly-XXXXXXXX)\ntrap 'rm -f \"$t\"' EXIT\ncat > \"$t\"\nchmod {:o} \"$t\"\n",
        sh::quote_min(&dir),
        attrs.mode
    );
    if let Some((u, g)) = attrs.owner {
        script.push_str(&format!("chown {u}:{g} \"$t\"\n"));
    }
    script.push_str(&format!(
        "mv -f \"$t\" {}\ntrap - EXIT\n",
        sh::quote_min(&real)
    ));
    let out = host.run(
        &Cmd::sh(script)
            .privileged(attrs.privileged)
            .stdin(data.to_vec()),
    )?;
    if out.ok() {
        Ok(())
    } else {
        Err(io_err(host, "write", path, &out))
    }
}

/// Stats paths in one script.
pub fn stat(
    host: &mut dyn Host,
    paths: &[String],
    digest: bool,
    privileged: bool,
) -> Result<Vec<Option<Stat>>, HostError> {
    for p in paths {
        check(host, "stat", p)?;
    }
    if paths.is_empty() {
        return Ok(Vec::new());
    }
    let real: Vec<String> = paths.iter().map(|p| host.real(p)).collect();
    let mut out_all = Vec::with_capacity(paths.len());
    // Keep each command line well below ARG_MAX.
    for chunk in real.chunks(400) {
        let script = crate::host::stat_script(chunk, digest);
        let cmd = Cmd::sh(script).privileged(privileged);
        let out = host.run(&cmd)?;
        if !out.ok() {
            return Err(io_err(host, "stat", &chunk[0], &out));
        }
        let parsed =
            parse_stat_output(&out.stdout_str(), chunk.len()).map_err(|e| HostError::Garbage {
                host: host.describe(),
                what: "stat".into(),
                output: format!("{e}: {}", crate::host::shorten(&out.stdout_str(), 200)),
            })?;
        out_all.extend(parsed);
    }
    Ok(out_all)
}

/// The script that makes directory `real` (a host path) with the mode and
/// owner of `attrs` (`set -e`: it fails as soon as a step does).
pub fn mkdir_script(real: &str, attrs: &FileAttrs) -> String {
    let p = sh::quote_min(real);
    let mut script = format!("set -e\nmkdir -m {:o} {p}\n", attrs.mode);
    if let Some((u, g)) = attrs.owner {
        script.push_str(&format!("chown {u}:{g} {p}\n"));
    }
    script
}

/// The script that makes symlink `real` (a host path) to `target`, owned
/// as `attrs` says.
pub fn symlink_script(real: &str, target: &str, attrs: &FileAttrs) -> String {
    let p = sh::quote_min(real);
    let mut script = format!("set -e\nln -s -- {} {p}\n", sh::quote_min(target));
    if let Some((u, g)) = attrs.owner {
        script.push_str(&format!("chown -h {u}:{g} {p}\n"));
    }
    script
}

/// The script that writes `data` to `real` (a host path) atomically, as
/// [`write_file`] does, with the content carried in the script itself
/// (base64 in a here-document) instead of on stdin: for a batch of steps,
/// whose commands all share one standard input.
pub fn write_inline_script(real: &str, data: &[u8], attrs: &FileAttrs) -> String {
    use base64::Engine as _;
    let dir = crate::host::parent(real).unwrap_or("/");
    let b64 = base64::engine::general_purpose::STANDARD.encode(data);
    let mut lines = String::new();
    for chunk in b64.as_bytes().chunks(76) {
        lines.push_str(&String::from_utf8_lossy(chunk));
        lines.push('\n');
    }
    let mut script = format!(
        "set -e\nt=$(mktemp {}/.charly-XXXXXXXX)\ntrap 'rm -f \"$t\"' EXIT\nbase64 -d > \"$t\" <<'CHARLY_DATA'\n{lines}CHARLY_DATA\nchmod {:o} \"$t\"\n",
        sh::quote_min(dir),
        attrs.mode
    );
    if let Some((u, g)) = attrs.owner {
        script.push_str(&format!("chown {u}:{g} \"$t\"\n"));
    }
    script.push_str(&format!(
        "mv -f \"$t\" {}\ntrap - EXIT\n",
        sh::quote_min(real)
    ));
    script
}

/// The script that prints the content of the regular file `real` (a host
/// path) in base64 when it is at most `max` bytes, `@too-big` when it is
/// larger, and nothing for anything else (absent, a link, a directory).
pub fn read_inline_script(real: &str, max: u64) -> String {
    format!(
        "p={}; if [ -f \"$p\" ] && [ ! -L \"$p\" ]; then if [ \"$(stat -c %s -- \"$p\")\" -le {max} ]; then base64 -w0 < \"$p\"; else echo @too-big; fi; fi",
        sh::quote_min(real)
    )
}

/// `mkdir -m MODE` plus chown.
pub fn mkdir(host: &mut dyn Host, path: &str, attrs: &FileAttrs) -> Result<(), HostError> {
    check(host, "mkdir", path)?;
    let script = mkdir_script(&host.real(path), attrs);
    let out = host.run(&Cmd::sh(script).privileged(attrs.privileged))?;
    if out.ok() {
        Ok(())
    } else {
        Err(io_err(host, "mkdir", path, &out))
    }
}

/// `ln -s` plus `chown -h`.
pub fn symlink(
    host: &mut dyn Host,
    path: &str,
    target: &str,
    attrs: &FileAttrs,
) -> Result<(), HostError> {
    check(host, "symlink", path)?;
    let script = symlink_script(&host.real(path), target, attrs);
    let out = host.run(&Cmd::sh(script).privileged(attrs.privileged))?;
    if out.ok() {
        Ok(())
    } else {
        Err(io_err(host, "symlink", path, &out))
    }
}

/// Removes a file, link or empty directory (exit 5: directory not empty).
pub fn remove(host: &mut dyn Host, path: &str, privileged: bool) -> Result<bool, HostError> {
    check(host, "remove", path)?;
    let p = sh::quote_min(&host.real(path));
    let script = format!(
        "if [ -d {p} ] && [ ! -L {p} ]; then rmdir -- {p} 2>/dev/null || {{ [ -d {p} ] && exit 5; }}; else rm -f -- {p}; fi"
    );
    let out = host.run(&Cmd::sh(script).privileged(privileged))?;
    match out.status {
        0 => Ok(true),
        5 => Ok(false),
        _ => Err(io_err(host, "remove", path, &out)),
    }
}

/// Unpacks a tar from stdin below the host's root with GNU tar, keeping
/// modes, leaving existing directories' metadata alone.
pub fn extract_tar(host: &mut dyn Host, tar: &[u8], privileged: bool) -> Result<(), HostError> {
    let dest = host.real("/");
    let script = format!(
        "exec tar -x -p -m --no-overwrite-dir --numeric-owner -f - -C {}",
        sh::quote_min(&dest)
    );
    let out = host.run(&Cmd::sh(script).privileged(privileged).stdin(tar.to_vec()))?;
    if out.ok() {
        Ok(())
    } else {
        Err(io_err(host, "extract into", &dest, &out))
    }
}

/// `command -v`-style lookup on an explicit PATH.
pub fn which(host: &mut dyn Host, name: &str, path: &str) -> Result<Option<String>, HostError> {
    let script = format!(
        "P={}; IFS=:; for d in $P; do if [ -f \"$d\"/{n} ] && [ -x \"$d\"/{n} ]; then printf '%s\\n' \"$d\"/{n}; exit 0; fi; done; exit 1",
        sh::quote_min(path),
        n = sh::quote_min(name)
    );
    let out = host.run(&Cmd::sh(script))?;
    if out.ok() {
        let s = out.stdout_str();
        let line = s.lines().next().unwrap_or("").trim().to_string();
        if !line.starts_with('/') {
            return Err(HostError::Garbage {
                host: host.describe(),
                what: format!("which {name}"),
                output: crate::host::shorten(&s, 200),
            });
        }
        Ok(Some(line))
    } else {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The inline write and read scripts round-trip bytes through a real
    /// shell (coreutils base64, mktemp, mv).
    #[test]
    fn inline_scripts_write_and_read_back_bytes() {
        let t = tempfile::tempdir().expect("tmp");
        let f = t.path().join("a b'c");
        let data: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        let sh = |script: String| {
            let out = std::process::Command::new("/bin/sh")
                .args(["-c", &script])
                .output()
                .expect("sh");
            assert!(out.status.success(), "{out:?}");
            out.stdout
        };
        let real = f.display().to_string();
        sh(write_inline_script(
            &real,
            &data,
            &FileAttrs {
                mode: 0o640,
                owner: None,
                privileged: false,
            },
        ));
        assert_eq!(std::fs::read(&f).expect("written"), data);
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(
            std::fs::metadata(&f).expect("meta").permissions().mode() & 0o777,
            0o640
        );
        use base64::Engine as _;
        let back = sh(read_inline_script(&real, 4096));
        assert_eq!(
            base64::engine::general_purpose::STANDARD
                .decode(&back)
                .expect("base64"),
            data
        );
        assert_eq!(sh(read_inline_script(&real, 10)), b"@too-big\n");
        assert!(sh(read_inline_script(&format!("{real}.none"), 10)).is_empty());
        sh(write_inline_script(&real, b"", &FileAttrs::default()));
        assert_eq!(std::fs::read(&f).expect("empty"), b"");
    }
}

//! Package-manager words per format: which tools a step needs, how to ask
//! what is installed (parsed strictly: anything unexpected is reported as
//! garbage, never guessed), how to read a package file's name, and the
//! built-in removal used when only part of a recorded set is still there.
//!
//! A rooted host installs local packages with the package manager's own
//! root option (`dpkg --root`), which confines them to the directory.

use charly_rules::sh;
use std::collections::BTreeSet;

/// Tools a format's install needs on the target.
pub fn tools(format: &str) -> &'static [&'static str] {
    match format {
        "deb" => &["apt-get", "dpkg-query"],
        "rpm" => &["rpm"],
        "pac" | "aur" => &["pacman"],
        _ => &[],
    }
}

/// A script that lists which of `pkgs` are installed (see [`parse_installed`]).
pub fn query_script(format: &str, pkgs: &[String], root: Option<&str>) -> Option<String> {
    let list = pkgs
        .iter()
        .map(|p| sh::quote_min(p))
        .collect::<Vec<_>>()
        .join(" ");
    Some(match format {
        "deb" => {
            let admin = root
                .map(|r| {
                    format!(
                        " --admindir={}",
                        sh::quote_min(&format!("{}/var/lib/dpkg", r.trim_end_matches('/')))
                    )
                })
                .unwrap_or_default();
            format!(
                "dpkg-query{admin} -W -f='${{Package}}\\t${{db:Status-Abbrev}}\\n' -- {list} 2>/dev/null; exit 0"
            )
        }
        "rpm" => {
            let r = root
                .map(|r| format!(" --root {}", sh::quote_min(r)))
                .unwrap_or_default();
            format!("rpm{r} -q --qf '%{{NAME}}\\tinstalled\\n' -- {list}; exit 0")
        }
        "pac" | "aur" => {
            let r = root
                .map(|r| format!(" -r {}", sh::quote_min(r)))
                .unwrap_or_default();
            format!("pacman{r} -Q -- {list} 2>/dev/null; exit 0")
        }
        _ => return None,
    })
}

/// A script that lists every installed package, in [`query_script`]'s
/// output form (so [`parse_installed`] reads it).
pub fn list_all_script(format: &str) -> Option<String> {
    Some(match format {
        "deb" => "dpkg-query -W -f='${Package}\\t${db:Status-Abbrev}\\n'".to_string(),
        "rpm" => "rpm -qa --qf '%{NAME}\\tinstalled\\n'".to_string(),
        "pac" | "aur" => "pacman -Q".to_string(),
        _ => return None,
    })
}

/// Parses [`query_script`] output into the installed subset.
pub fn parse_installed(format: &str, out: &str) -> Result<BTreeSet<String>, String> {
    let mut set = BTreeSet::new();
    for line in out.lines().filter(|l| !l.trim().is_empty()) {
        match format {
            "deb" => {
                let (name, status) = line
                    .split_once('\t')
                    .ok_or_else(|| format!("no tab in `{line}`"))?;
                let st = status.as_bytes();
                if name.is_empty() || st.len() < 2 || !st[0].is_ascii_lowercase() {
                    return Err(format!("unreadable status line `{line}`"));
                }
                // Second letter of db:Status-Abbrev: `i` = installed.
                if st[1] == b'i' {
                    set.insert(name.split(':').next().unwrap_or(name).to_string());
                }
            }
            "rpm" => {
                if let Some((name, rest)) = line.split_once('\t') {
                    if rest != "installed" {
                        return Err(format!("unreadable line `{line}`"));
                    }
                    set.insert(name.to_string());
                } else if !(line.starts_with("package ") && line.ends_with("is not installed")) {
                    return Err(format!("unreadable line `{line}`"));
                }
            }
            "pac" | "aur" => {
                let mut w = line.split_whitespace();
                match (w.next(), w.next(), w.next()) {
                    (Some(n), Some(_), None) => {
                        set.insert(n.to_string());
                    }
                    _ => return Err(format!("unreadable line `{line}`")),
                }
            }
            other => return Err(format!("unknown package format {other}")),
        }
    }
    Ok(set)
}

/// A script printing the package name inside a package file (a real path).
pub fn name_script(format: &str, file: &str) -> Option<String> {
    Some(match format {
        "deb" => format!("dpkg-deb -f {} Package", sh::quote_min(file)),
        "rpm" => format!("rpm -qp --qf '%{{NAME}}\\n' {}", sh::quote_min(file)),
        "pac" => format!("pacman -Qqp {}", sh::quote_min(file)),
        _ => return None,
    })
}

/// Whether a package name looks like one (guards against garbage output).
pub fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() < 256
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.' | b'_' | b'@'))
}

/// The built-in removal of packages (rooted: the package manager's root option).
pub fn remove_script(format: &str, pkgs: &[String], root: Option<&str>) -> String {
    let list = pkgs
        .iter()
        .map(|p| sh::quote_min(p))
        .collect::<Vec<_>>()
        .join(" ");
    match (format, root) {
        ("deb", Some(r)) => format!("dpkg --root={} -P -- {list}", sh::quote_min(r)),
        ("deb", None) => format!("DEBIAN_FRONTEND=noninteractive apt-get purge -y -- {list}"),
        ("rpm", Some(r)) => format!("rpm --root {} -e -- {list}", sh::quote_min(r)),
        ("rpm", None) => format!(
            "if command -v dnf >/dev/null; then dnf remove -y {list}; else rpm -e -- {list}; fi"
        ),
        (_, Some(r)) => format!("pacman -r {} -R --noconfirm -- {list}", sh::quote_min(r)),
        (_, None) => format!("pacman -R --noconfirm -- {list}"),
    }
}

/// The built-in local-package install (rooted: dpkg's root option).
pub fn install_files_script(format: &str, dir: &str, glob: &str, root: Option<&str>) -> String {
    let files = format!("{}/{glob}", sh::quote_min(dir));
    match (format, root) {
        ("deb", Some(r)) => format!("dpkg --root={} -i {files}", sh::quote_min(r)),
        ("deb", None) => format!("DEBIAN_FRONTEND=noninteractive apt-get install -y {files}"),
        ("rpm", Some(r)) => format!("rpm --root {} -i {files}", sh::quote_min(r)),
        ("rpm", None) => format!(
            "if command -v dnf >/dev/null; then dnf install -y {files}; else rpm -i {files}; fi"
        ),
        (_, Some(r)) => format!("pacman -r {} -U --noconfirm {files}", sh::quote_min(r)),
        (_, None) => format!("pacman -U --noconfirm {files}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deb_status_parsing() {
        let s = parse_installed("deb", "jq\tii \ntree\tun \nlibc6:amd64\tii \n").expect("parse");
        assert_eq!(
            s.into_iter().collect::<Vec<_>>(),
            vec!["jq".to_string(), "libc6".to_string()]
        );
        assert!(parse_installed("deb", "<html>oops</html>").is_err());
        assert!(parse_installed("deb", "x\t\n").is_err());
    }

    #[test]
    fn rpm_and_pac_parsing() {
        let s =
            parse_installed("rpm", "bash\tinstalled\npackage jq is not installed\n").expect("rpm");
        assert!(s.contains("bash") && !s.contains("jq"));
        assert!(parse_installed("rpm", "error: rpmdb open failed").is_err());
        let p = parse_installed("pac", "bash 5.2-1\n").expect("pac");
        assert!(p.contains("bash"));
        assert!(parse_installed("pac", "garbage").is_err());
    }

    #[test]
    fn rooted_words() {
        assert!(remove_script("deb", &["a".into()], Some("/r")).starts_with("dpkg --root=/r -P"));
        assert!(
            query_script("deb", &["a".into()], Some("/r"))
                .expect("deb")
                .contains("--admindir=/r/var/lib/dpkg")
        );
        assert!(valid_name("hello-charly") && !valid_name("a b") && !valid_name(""));
    }
}

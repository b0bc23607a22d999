//! At most one locked cache mount per `RUN`, and it is the RUN's last cache
//! mount.
//!
//! buildah before 1.29 (Debian 12 ships podman 4.3 with buildah 1.28)
//! remembers the lock of only the *last* cache mount of a RUN: the list of
//! locks to release is overwritten by each cache mount it sets up, so a
//! `sharing=locked` mount followed by any other cache mount is never
//! unlocked, and the next RUN of the same build that mounts that cache waits
//! for itself forever (no CPU, no error; containers/buildah#4342, fixed by
//! #4349). The package caches of a format (`/var/cache/apt` and
//! `/var/lib/apt`) are two locked mounts in every package RUN, so any box
//! with two such RUNs in one stage hung there.
//!
//! The rewrite keeps the last locked cache mount of each RUN locked, moves
//! it behind the RUN's other cache mounts (their relative order and every
//! other flag stay as they are) and makes the earlier locked ones
//! `sharing=shared`. A format's package caches are always mounted together,
//! so the one lock still serializes the RUNs that use them. `locked` and
//! `shared` have the same length, and a moved mount stays inside its RUN, so
//! byte offsets of instructions (origins) do not move. The rewrite is
//! idempotent.

use super::containerfile::heredoc_end;

/// Whether `token` is a cache mount flag.
fn is_cache_mount(token: &str) -> bool {
    token
        .strip_prefix("--mount=")
        .is_some_and(|opts| opts.split(',').any(|o| o == "type=cache"))
}

fn is_locked(token: &str) -> bool {
    token.split(',').any(|o| o == "sharing=locked")
}

/// A cache-mount flag with `sharing=locked` made `sharing=shared`.
pub fn unlocked(token: &str) -> String {
    token
        .split(',')
        .map(|o| {
            if o == "sharing=locked" {
                "sharing=shared"
            } else {
                o
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Byte ranges of the cache-mount flags of the RUN instruction starting at
/// `at` (the offset of its `RUN` word) in `text`.
fn cache_flags(text: &str, at: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut pos = at + "RUN".len();
    let bytes = text.as_bytes();
    loop {
        // Skip blanks and line continuations (`\` then a line break).
        while pos < bytes.len() {
            match bytes[pos] {
                b' ' | b'\t' => pos += 1,
                b'\\' if bytes.get(pos + 1) == Some(&b'\n') => pos += 2,
                _ => break,
            }
        }
        let end = text[pos..]
            .find(|c: char| c.is_whitespace())
            .map_or(text.len(), |n| pos + n);
        let token = &text[pos..end];
        if !token.starts_with("--") {
            return out;
        }
        if is_cache_mount(token) {
            out.push((pos, end));
        }
        pos = end;
    }
}

/// The offsets of the `RUN` words of `text`'s RUN instructions (not in
/// comments, here-documents or continuation lines).
fn run_offsets(text: &str) -> Vec<usize> {
    let mut runs = Vec::new();
    let mut continued = false;
    let mut heredoc: Option<String> = None;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let start = offset;
        offset += line.len();
        let l = line.trim_end_matches('\n');
        if let Some(end) = &heredoc {
            if l.trim() == end {
                heredoc = None;
            }
            continue;
        }
        let t = l.trim_start();
        if !continued {
            let word = t.split_whitespace().next().unwrap_or("");
            if word.eq_ignore_ascii_case("RUN") {
                runs.push(start + (l.len() - t.len()));
            }
        }
        heredoc = heredoc_end(t);
        continued = l.trim_end().ends_with('\\');
    }
    runs
}

/// Replaces every cache-mount flag of every RUN instruction of `text` (a
/// whole `--mount=type=cache,…` token) by what `f` makes of it; a RUN's
/// script, comments and here-documents are left alone.
pub fn map_cache_mounts(text: &mut String, mut f: impl FnMut(&str) -> String) {
    let mut edits: Vec<(usize, usize, String)> = Vec::new();
    for at in run_offsets(text) {
        for (s, e) in cache_flags(text, at) {
            let new = f(&text[s..e]);
            if text[s..e] != new {
                edits.push((s, e, new));
            }
        }
    }
    for (s, e, new) in edits.into_iter().rev() {
        text.replace_range(s..e, &new);
    }
}

/// Rewrites `text` so that no RUN holds more than one locked cache mount,
/// and that one is its last cache mount (see the module docs).
pub fn one_lock_per_run(text: &mut String) {
    if !text.contains("sharing=locked") {
        return;
    }
    let mut edits: Vec<(usize, usize, String)> = Vec::new();
    for at in run_offsets(text) {
        let flags = cache_flags(text, at);
        let Some(chosen) = flags.iter().rposition(|&(s, e)| is_locked(&text[s..e])) else {
            continue;
        };
        let tokens: Vec<&str> = flags.iter().map(|&(s, e)| &text[s..e]).collect();
        let mut order: Vec<String> = tokens
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != chosen)
            .map(|(_, t)| unlocked(t))
            .collect();
        order.push(tokens[chosen].to_string());
        for (&(s, e), new) in flags.iter().zip(order) {
            if text[s..e] != new {
                edits.push((s, e, new));
            }
        }
    }
    for (s, e, new) in edits.into_iter().rev() {
        text.replace_range(s..e, &new);
    }
}

#[cfg(test)]
mod tests {
    use super::one_lock_per_run;

    fn fixed(s: &str) -> String {
        let mut t = s.to_string();
        one_lock_per_run(&mut t);
        t
    }

    const APT: &str = "RUN --mount=type=cache,id=charly-var-cache-apt,dst=/var/cache/apt,sharing=locked \\\n    --mount=type=cache,id=charly-var-lib-apt,dst=/var/lib/apt,sharing=locked \\\n    apt-get update\n";

    #[test]
    fn the_last_locked_mount_keeps_the_lock() {
        assert_eq!(
            fixed(APT),
            "RUN --mount=type=cache,id=charly-var-cache-apt,dst=/var/cache/apt,sharing=shared \\\n    --mount=type=cache,id=charly-var-lib-apt,dst=/var/lib/apt,sharing=locked \\\n    apt-get update\n"
        );
    }

    #[test]
    fn a_locked_mount_moves_behind_later_cache_mounts() {
        let s = "FROM x\nRUN --mount=type=bind,from=a,source=/,target=/ctx \\\n    --mount=type=cache,id=charly-tmp-downloads,dst=/tmp/downloads,sharing=locked \\\n    --mount=type=cache,id=charly-x-uid1000,dst=/x,uid=1000,gid=1000 \\\n    bash /tmp/s.sh --mount=type=cache,sharing=locked\n";
        let out = fixed(s);
        assert_eq!(
            out,
            "FROM x\nRUN --mount=type=bind,from=a,source=/,target=/ctx \\\n    --mount=type=cache,id=charly-x-uid1000,dst=/x,uid=1000,gid=1000 \\\n    --mount=type=cache,id=charly-tmp-downloads,dst=/tmp/downloads,sharing=locked \\\n    bash /tmp/s.sh --mount=type=cache,sharing=locked\n"
        );
        assert_eq!(out.len(), s.len());
        assert_eq!(fixed(&out), out, "idempotent");
    }

    #[test]
    fn runs_are_independent_and_other_text_is_untouched() {
        let s = format!(
            "{APT}RUN --mount=type=cache,id=a,dst=/a,sharing=locked true\n# RUN --mount=type=cache,id=b,dst=/b,sharing=locked --mount=type=cache,id=c,dst=/c,sharing=locked\nRUN <<EOF\nRUN --mount=type=cache,id=b,dst=/b,sharing=locked --mount=type=cache,id=c,dst=/c\nEOF\n"
        );
        let out = fixed(&s);
        assert_eq!(out.matches("sharing=locked").count(), 5, "{out}");
        assert!(out.contains("RUN --mount=type=cache,id=a,dst=/a,sharing=locked true\n"));
        assert!(out.ends_with("RUN <<EOF\nRUN --mount=type=cache,id=b,dst=/b,sharing=locked --mount=type=cache,id=c,dst=/c\nEOF\n"));
    }
}

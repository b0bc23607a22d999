//! Quoting words for a POSIX shell: the one place that says how charly
//! quotes.
//!
//! **Why one module.** Quoted words end up in generated scripts and
//! Containerfiles (cache-key inputs: one byte more changes a key) and in
//! commands run on hosts (a quoting slip is an injection). Several quoters
//! grew in several crates; they are collected here, and where their outputs
//! differ the difference is a separate, named function rather than an
//! accident of which copy a caller happened to use:
//!
//! | function | `it's` | `a b` | `/usr/bin` | `100%` | `` (empty) |
//! | --- | --- | --- | --- | --- | --- |
//! | [`quote`] | `'it'\''s'` | `'a b'` | `'/usr/bin'` | `'100%'` | `''` |
//! | [`quote_min`] | `'it'\''s'` | `'a b'` | `/usr/bin` | `'100%'` | `''` |
//! | [`quote_min_pct`] | `'it'\''s'` | `'a b'` | `/usr/bin` | `100%` | `''` |
//!
//! * [`quote`] always quotes. The Containerfile emitter and check beds use
//!   it: their output is pinned by golden tests and every value reads the
//!   same whatever it holds.
//! * [`quote_min`] leaves a word bare when every byte is an ASCII letter or
//!   digit or one of `/ . _ - = : + , @`. Deploy commands use it (they are
//!   shown to people in `--dry-run` and logs).
//! * [`quote_min_pct`] also leaves `%` bare: the set of Go's
//!   `shellescape.Quote`, which the original's `shquote` template function
//!   uses. The template function produces these bytes, and so does the REAPI
//!   stage interpreter (`charly-reapi`), which is why this is a leaf crate.
//!
//! All three quote the same way when they quote: the word between single
//! quotes, each `'` written as `'\''`. Nothing else needs escaping inside
//! single quotes (`$`, `` ` ``, `\`, newlines and non-ASCII text are literal
//! there), and any byte outside the bare set, including every non-ASCII
//! byte, makes the minimal variants quote.

/// The start of every cmd script, in images and on hosts: the machine's
/// architecture as `BUILD_ARCH` (uname) and `ARCH` (Go's names).
pub const ARCH_PREAMBLE: &str = "BUILD_ARCH=$(uname -m)\ncase \"$BUILD_ARCH\" in x86_64) ARCH=amd64 ;; aarch64) ARCH=arm64 ;; armv7l|armv7|armhf) ARCH=arm ;; *) ARCH=$BUILD_ARCH ;; esac\nexport BUILD_ARCH ARCH\n";

/// Single-quotes a word, always (even a word that would be safe bare).
pub fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Single-quotes a word unless it is non-empty and every byte is an ASCII
/// letter, digit or one of `/ . _ - = : + , @`.
pub fn quote_min(s: &str) -> String {
    quote_unless_bare(s, b"/._-=:+,@")
}

/// Like [`quote_min`], with `%` also left bare (Go's `shellescape.Quote`,
/// the original's `shquote` template function).
pub fn quote_min_pct(s: &str) -> String {
    quote_unless_bare(s, b"/._-=:+,@%")
}

/// Joins an argv into one command line, each word as [`quote_min`] quotes it.
pub fn join_min(argv: &[String]) -> String {
    argv.iter()
        .map(|a| quote_min(a))
        .collect::<Vec<_>>()
        .join(" ")
}

fn quote_unless_bare(s: &str, extra: &[u8]) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || extra.contains(&b))
    {
        return s.to_string();
    }
    quote(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tricky words and what each variant makes of them.
    const CASES: &[(&str, &str, &str, &str)] = &[
        // (input, quote, quote_min, quote_min_pct)
        ("", "''", "''", "''"),
        ("plain", "'plain'", "plain", "plain"),
        ("/usr/bin", "'/usr/bin'", "/usr/bin", "/usr/bin"),
        (
            "a-1.0_x/y:z=w@v+t,s",
            "'a-1.0_x/y:z=w@v+t,s'",
            "a-1.0_x/y:z=w@v+t,s",
            "a-1.0_x/y:z=w@v+t,s",
        ),
        ("a b", "'a b'", "'a b'", "'a b'"),
        (" ", "' '", "' '", "' '"),
        ("it's", "'it'\\''s'", "'it'\\''s'", "'it'\\''s'"),
        ("'", "''\\'''", "''\\'''", "''\\'''"),
        ("''", "''\\'''\\'''", "''\\'''\\'''", "''\\'''\\'''"),
        ("$HOME", "'$HOME'", "'$HOME'", "'$HOME'"),
        ("${X:-y}", "'${X:-y}'", "'${X:-y}'", "'${X:-y}'"),
        ("$(id)", "'$(id)'", "'$(id)'", "'$(id)'"),
        ("`id`", "'`id`'", "'`id`'", "'`id`'"),
        ("a\nb", "'a\nb'", "'a\nb'", "'a\nb'"),
        ("a\tb", "'a\tb'", "'a\tb'", "'a\tb'"),
        (
            "back\\slash",
            "'back\\slash'",
            "'back\\slash'",
            "'back\\slash'",
        ),
        ("100%", "'100%'", "'100%'", "100%"),
        ("%{NAME}", "'%{NAME}'", "'%{NAME}'", "'%{NAME}'"),
        ("a;rm", "'a;rm'", "'a;rm'", "'a;rm'"),
        ("*.deb", "'*.deb'", "'*.deb'", "'*.deb'"),
        ("~", "'~'", "'~'", "'~'"),
        ("héllo", "'héllo'", "'héllo'", "'héllo'"),
        ("日本", "'日本'", "'日本'", "'日本'"),
        ("a\u{2028}b", "'a\u{2028}b'", "'a\u{2028}b'", "'a\u{2028}b'"),
        ("--flag=x", "'--flag=x'", "--flag=x", "--flag=x"),
    ];

    #[test]
    fn variants_pinned_on_tricky_words() {
        for (input, always, min, pct) in CASES {
            assert_eq!(quote(input), *always, "quote({input:?})");
            assert_eq!(quote_min(input), *min, "quote_min({input:?})");
            assert_eq!(quote_min_pct(input), *pct, "quote_min_pct({input:?})");
        }
    }

    /// The assertions the deploy crate's `host::sq` carried before it moved here.
    #[test]
    fn deploy_quoting_unchanged() {
        assert_eq!(quote_min("/usr/bin"), "/usr/bin");
        assert_eq!(quote_min("a b"), "'a b'");
        assert_eq!(quote_min("it's"), "'it'\\''s'");
        assert_eq!(quote_min(""), "''");
    }

    #[test]
    fn join_quotes_each_word() {
        let argv: Vec<String> = ["ls", "-l", "a b", "100%", ""]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(join_min(&argv), "ls -l 'a b' '100%' ''");
        assert_eq!(join_min(&[]), "");
    }

    /// The `shquote` template function (Go's shellescape set) renders
    /// exactly [`quote_min_pct`].
    #[test]
    fn template_shquote_is_quote_min_pct() {
        for (input, _, _, pct) in CASES {
            let out = crate::template::render(
                "t",
                "{{shquote .}}",
                &serde_json::Value::String(input.to_string()),
            )
            .expect("render");
            assert_eq!(out, *pct, "shquote {input:?}");
        }
    }

    /// A quoted word read back by a shell is the word itself.
    #[test]
    fn quoted_words_round_trip_through_sh() {
        let Ok(_) = std::process::Command::new("sh").arg("-c").arg(":").status() else {
            return;
        };
        for (input, _, _, _) in CASES {
            for q in [quote(input), quote_min(input), quote_min_pct(input)] {
                let out = std::process::Command::new("sh")
                    .arg("-c")
                    .arg(format!("printf '%s' {q}"))
                    .output()
                    .expect("sh");
                assert_eq!(String::from_utf8_lossy(&out.stdout), *input, "{q}");
            }
        }
    }
}

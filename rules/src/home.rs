//! Expanding the home directory in paths and values: `~`, `~/…`, `${HOME}`
//! and `$HOME`.
//!
//! **Why one function.** The emitters (Containerfile, quadlet), the plan
//! compiler (which expands to [`crate::ir::HOME_TOKEN`] and resolves it
//! later) and the check beds all expand the same spellings; one copy per
//! caller drifted once already (checks leave a lone `~` alone). The one
//! difference that exists is explicit: a [`Tilde`] argument says whether a
//! lone `~` is the home.
//!
//! Order matters and is the same for every caller: the tilde first (only at
//! the start), then every `${HOME}`, then every `$HOME`. `$HOME` is replaced
//! as text, so `$HOMEDIR` becomes `<home>DIR`, as it always has.

/// Which tildes are the home.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tilde {
    /// A lone `~` and a leading `~/` (emitters, plans).
    BareAndSlash,
    /// Only a leading `~/`; a lone `~` stays as written (check beds).
    SlashOnly,
}

/// Expands a leading tilde to `home` (nothing else).
pub fn expand_tilde(s: &str, home: &str, tilde: Tilde) -> String {
    if s == "~" && tilde == Tilde::BareAndSlash {
        home.to_string()
    } else if let Some(r) = s.strip_prefix("~/") {
        format!("{home}/{r}")
    } else {
        s.to_string()
    }
}

/// Expands `~` (alone), a leading `~/`, `${HOME}` and `$HOME` to `home`.
pub fn expand_home(s: &str, home: &str) -> String {
    expand_home_with(s, home, Tilde::BareAndSlash)
}

/// [`expand_home`] with the tilde rule spelled out.
pub fn expand_home_with(s: &str, home: &str, tilde: Tilde) -> String {
    expand_tilde(s, home, tilde)
        .replace("${HOME}", home)
        .replace("$HOME", home)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_every_spelling() {
        let h = "/home/u";
        assert_eq!(expand_home("~", h), "/home/u");
        assert_eq!(expand_home("~/", h), "/home/u/");
        assert_eq!(expand_home("~/.local/bin", h), "/home/u/.local/bin");
        assert_eq!(expand_home("${HOME}/x", h), "/home/u/x");
        assert_eq!(expand_home("$HOME/x:$HOME/y", h), "/home/u/x:/home/u/y");
        assert_eq!(expand_home("a:${HOME}:$HOME", h), "a:/home/u:/home/u");
        // Only a leading tilde; `~user` is not ours.
        assert_eq!(expand_home("/opt/~/x", h), "/opt/~/x");
        assert_eq!(expand_home("~user/x", h), "~user/x");
        // Text replacement, as before.
        assert_eq!(expand_home("$HOMEDIR", h), "/home/uDIR");
        assert_eq!(expand_home("", h), "");
    }

    #[test]
    fn lone_tilde_depends_on_the_rule() {
        let h = "/root";
        assert_eq!(expand_home_with("~", h, Tilde::BareAndSlash), "/root");
        assert_eq!(expand_home_with("~", h, Tilde::SlashOnly), "~");
        assert_eq!(expand_home_with("~/a", h, Tilde::SlashOnly), "/root/a");
        assert_eq!(expand_home_with("$HOME", h, Tilde::SlashOnly), "/root");
    }

    #[test]
    fn tilde_only_leaves_variables() {
        assert_eq!(expand_tilde("~", "$HOME", Tilde::BareAndSlash), "$HOME");
        assert_eq!(expand_tilde("~/b", "$HOME", Tilde::BareAndSlash), "$HOME/b");
        assert_eq!(
            expand_tilde("${HOME}/b", "$HOME", Tilde::BareAndSlash),
            "${HOME}/b"
        );
    }

    #[test]
    fn the_token_home_expands_like_a_real_one() {
        let t = crate::ir::HOME_TOKEN;
        assert_eq!(expand_home("~/x", t), format!("{t}/x"));
        assert_eq!(expand_home("$HOME", t), t);
    }
}

//! Node ids: what a graph node is, by name.
//!
//! A [`NodeId`] is built from typed parts; its `Display` is the id text that
//! keys (`KeyInputs::deps`), records, journals, reports and `explain` carry,
//! unchanged since key schema 1, and `FromStr` reads that text back (queries
//! typed by a user, lookups by the deploy walker). Nothing outside this
//! module formats or parses ids.
//!
//! | id | text |
//! |---|---|
//! | candy sources | `source:candy/<candy>` |
//! | box file | `source:box/<box>` |
//! | local-package sources | `source:localpkg/<candy>/<format>` |
//! | fragment | `fragment:<box>/<candy>` |
//! | build directory | `containerfile:<box>` (`+artifacts` with prebuilt stages) |
//! | builder stage | `builder-stage:<candy>/<builder>@<image box>[~uid:gid:home]` |
//! | local package | `local-pkg:<candy>/<format>@<image it is built in>` (a box, or an external reference) |
//! | root filesystem | `rootfs:<box>` |
//! | image | `image:<box>` |
//! | plan | `plan:<box>@<target>` |
//! | layer | `layer:<box>/<candy>`, `layer:<box>#setup`, `layer:<box>#init` |
//! | external base image | `base:<reference>` |
//!
//! A layer shared by several boxes (same parent, same text, same inputs:
//! the same key) is one node named after the first of them; the others'
//! ids are aliases of it (`Graph::node`).
//!
//! Box names never contain `/`, `@` or `~`; formats and builders are plain
//! words; a candy key may contain `/` (remote candies) but never `@` or `~`.

use charly_rules::plan::Target;
use charly_rules::resolve::User;
use std::fmt;
use std::str::FromStr;

use crate::key::NodeKind;

/// What a source node hashes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SourceId {
    /// A candy's directory (its `charly.yml` and the files it copies).
    Candy(String),
    /// A box's definition.
    Box(String),
    /// The source tree a candy's local package is built from.
    LocalPkg {
        /// Candy key.
        candy: String,
        /// Package format.
        format: String,
    },
}

/// The account a builder stage makes its artifact for, when it is not the
/// default `user` (uid 1000, home `/home/user`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StageUser {
    /// uid.
    pub uid: u32,
    /// gid.
    pub gid: u32,
    /// Home directory.
    pub home: String,
}

/// Which part of a box's layer chain a layer is.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LayerSlot {
    /// The box's setup on an external or bootstrapped base.
    Setup,
    /// One candy.
    Candy(String),
    /// The init configuration.
    Init,
}

/// A node's identity.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NodeId {
    /// Hashed inputs.
    Source(SourceId),
    /// One candy's Containerfile section for one box.
    Fragment {
        /// Box.
        box_name: String,
        /// Candy key.
        candy: String,
    },
    /// A box's build directory; `prebuilt`: builder stages come as artifact
    /// tars (for `box build`) rather than as stages.
    Containerfile {
        /// Box.
        box_name: String,
        /// With prebuilt artifacts.
        prebuilt: bool,
    },
    /// A builder stage run in a builder box's image.
    BuilderStage {
        /// Candy key.
        candy: String,
        /// Builder type.
        builder: String,
        /// The builder box (qualified).
        image_box: String,
        /// The account, unless the default one.
        user: Option<StageUser>,
    },
    /// A local package built from source.
    LocalPkg {
        /// Candy key.
        candy: String,
        /// Package format.
        format: String,
        /// What it is built in: the installing box's parent box (qualified),
        /// or its external base reference (a package is built for the
        /// distro and release it goes into).
        image: String,
    },
    /// A bootstrapped root filesystem.
    Rootfs {
        /// Box.
        box_name: String,
    },
    /// A box image.
    Image {
        /// Box.
        box_name: String,
    },
    /// A box's merged InstallPlan for a deploy target.
    Plan {
        /// Box.
        box_name: String,
        /// Target.
        target: Target,
    },
    /// One layer of a box's image.
    Layer {
        /// Box (the first of the boxes sharing it).
        box_name: String,
        /// Which layer.
        slot: LayerSlot,
    },
    /// An external base image, taken into the store layer by layer.
    Base {
        /// Its reference.
        reference: String,
    },
}

impl NodeId {
    /// `image:<box>`.
    pub fn image(box_name: &str) -> Self {
        NodeId::Image {
            box_name: box_name.into(),
        }
    }

    /// `containerfile:<box>[+artifacts]`.
    pub fn containerfile(box_name: &str, prebuilt: bool) -> Self {
        NodeId::Containerfile {
            box_name: box_name.into(),
            prebuilt,
        }
    }

    /// `fragment:<box>/<candy>`.
    pub fn fragment(box_name: &str, candy: &str) -> Self {
        NodeId::Fragment {
            box_name: box_name.into(),
            candy: candy.into(),
        }
    }

    /// The builder stage of `candy` with `builder` in `image_box`'s image,
    /// made for `user` (named in the id only when not the default account).
    pub fn builder_stage(candy: &str, builder: &str, image_box: &str, user: &User) -> Self {
        NodeId::BuilderStage {
            candy: candy.into(),
            builder: builder.into(),
            image_box: image_box.into(),
            user: (user.uid != 1000 || user.home != "/home/user").then(|| StageUser {
                uid: user.uid,
                gid: user.gid,
                home: user.home.clone(),
            }),
        }
    }

    /// `local-pkg:<candy>/<format>@<image>`.
    pub fn local_pkg(candy: &str, format: &str, image: &str) -> Self {
        NodeId::LocalPkg {
            candy: candy.into(),
            format: format.into(),
            image: image.into(),
        }
    }

    /// `layer:<box>/<candy>` (or `#setup`, `#init`).
    pub fn layer(box_name: &str, slot: LayerSlot) -> Self {
        NodeId::Layer {
            box_name: box_name.into(),
            slot,
        }
    }

    /// The kind of node this id names.
    pub fn kind(&self) -> NodeKind {
        match self {
            NodeId::Source(_) => NodeKind::Source,
            NodeId::Fragment { .. } => NodeKind::Fragment,
            NodeId::Containerfile { .. } => NodeKind::Containerfile,
            NodeId::BuilderStage { .. } => NodeKind::BuilderStage,
            NodeId::LocalPkg { .. } => NodeKind::LocalPkg,
            NodeId::Rootfs { .. } => NodeKind::Rootfs,
            NodeId::Image { .. } => NodeKind::Image,
            NodeId::Plan { .. } => NodeKind::Plan,
            NodeId::Layer { .. } => NodeKind::Layer,
            NodeId::Base { .. } => NodeKind::Base,
        }
    }

    /// The names an id is made of (boxes, candies, builders, formats,
    /// images, references): what a query may name a node by when it does
    /// not give the whole id.
    pub fn parts(&self) -> Vec<&str> {
        match self {
            NodeId::Source(SourceId::Candy(c) | SourceId::Box(c)) => vec![c],
            NodeId::Source(SourceId::LocalPkg { candy, format }) => vec![candy, format],
            NodeId::Fragment { box_name, candy } => vec![box_name, candy],
            NodeId::Containerfile { box_name, .. }
            | NodeId::Rootfs { box_name }
            | NodeId::Image { box_name }
            | NodeId::Plan { box_name, .. } => vec![box_name],
            NodeId::BuilderStage {
                candy,
                builder,
                image_box,
                ..
            } => vec![candy, builder, image_box],
            NodeId::LocalPkg {
                candy,
                format,
                image,
            } => vec![candy, format, image],
            NodeId::Layer { box_name, slot } => match slot {
                LayerSlot::Candy(c) => vec![box_name, c],
                LayerSlot::Setup | LayerSlot::Init => vec![box_name],
            },
            NodeId::Base { reference } => vec![reference],
        }
    }

    /// The box this node belongs to, for nodes of one box.
    pub fn box_name(&self) -> Option<&str> {
        match self {
            NodeId::Source(SourceId::Box(b))
            | NodeId::Fragment { box_name: b, .. }
            | NodeId::Containerfile { box_name: b, .. }
            | NodeId::Rootfs { box_name: b }
            | NodeId::Image { box_name: b }
            | NodeId::Plan { box_name: b, .. }
            | NodeId::Layer { box_name: b, .. } => Some(b),
            _ => None,
        }
    }
}

impl fmt::Display for SourceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourceId::Candy(c) => write!(f, "source:candy/{c}"),
            SourceId::Box(b) => write!(f, "source:box/{b}"),
            SourceId::LocalPkg { candy, format } => write!(f, "source:localpkg/{candy}/{format}"),
        }
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeId::Source(s) => s.fmt(f),
            NodeId::Fragment { box_name, candy } => write!(f, "fragment:{box_name}/{candy}"),
            NodeId::Containerfile { box_name, prebuilt } => {
                write!(f, "containerfile:{box_name}")?;
                if *prebuilt {
                    f.write_str("+artifacts")?;
                }
                Ok(())
            }
            NodeId::BuilderStage {
                candy,
                builder,
                image_box,
                user,
            } => {
                write!(f, "builder-stage:{candy}/{builder}@{image_box}")?;
                if let Some(u) = user {
                    write!(f, "~{}:{}:{}", u.uid, u.gid, u.home)?;
                }
                Ok(())
            }
            NodeId::LocalPkg {
                candy,
                format,
                image,
            } => write!(f, "local-pkg:{candy}/{format}@{image}"),
            NodeId::Rootfs { box_name } => write!(f, "rootfs:{box_name}"),
            NodeId::Image { box_name } => write!(f, "image:{box_name}"),
            NodeId::Plan { box_name, target } => write!(f, "plan:{box_name}@{}", target.as_str()),
            NodeId::Layer { box_name, slot } => match slot {
                LayerSlot::Setup => write!(f, "layer:{box_name}#setup"),
                LayerSlot::Candy(c) => write!(f, "layer:{box_name}/{c}"),
                LayerSlot::Init => write!(f, "layer:{box_name}#init"),
            },
            NodeId::Base { reference } => write!(f, "base:{reference}"),
        }
    }
}

/// Text that is not a node id.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a node id (e.g. image:BOX, fragment:BOX/CANDY, plan:BOX@TARGET)")]
pub struct BadNodeId(pub String);

fn nonempty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

fn parse(s: &str) -> Option<NodeId> {
    let (kind, rest) = s.split_once(':')?;
    Some(match kind {
        "source" => {
            let (what, name) = rest.split_once('/')?;
            NodeId::Source(match what {
                "candy" => SourceId::Candy(nonempty(name)?),
                "box" => SourceId::Box(nonempty(name)?),
                "localpkg" => {
                    let (candy, format) = name.rsplit_once('/')?;
                    SourceId::LocalPkg {
                        candy: nonempty(candy)?,
                        format: nonempty(format)?,
                    }
                }
                _ => return None,
            })
        }
        "fragment" => {
            let (box_name, candy) = rest.split_once('/')?;
            NodeId::Fragment {
                box_name: nonempty(box_name)?,
                candy: nonempty(candy)?,
            }
        }
        "containerfile" => match rest.strip_suffix("+artifacts") {
            Some(b) => NodeId::containerfile(&nonempty(b)?, true),
            None => NodeId::containerfile(&nonempty(rest)?, false),
        },
        "builder-stage" => {
            let (main, user) = match rest.split_once('~') {
                Some((m, u)) => {
                    let (uid, u) = u.split_once(':')?;
                    let (gid, home) = u.split_once(':')?;
                    (
                        m,
                        Some(StageUser {
                            uid: uid.parse().ok()?,
                            gid: gid.parse().ok()?,
                            home: nonempty(home)?,
                        }),
                    )
                }
                None => (rest, None),
            };
            let (cb, image_box) = main.rsplit_once('@')?;
            let (candy, builder) = cb.rsplit_once('/')?;
            NodeId::BuilderStage {
                candy: nonempty(candy)?,
                builder: nonempty(builder)?,
                image_box: nonempty(image_box)?,
                user,
            }
        }
        "local-pkg" => {
            // A candy key never holds `@`; an image reference may.
            let (cf, image) = rest.split_once('@')?;
            let (candy, format) = cf.rsplit_once('/')?;
            NodeId::local_pkg(&nonempty(candy)?, &nonempty(format)?, &nonempty(image)?)
        }
        "rootfs" => NodeId::Rootfs {
            box_name: nonempty(rest)?,
        },
        "image" => NodeId::image(&nonempty(rest)?),
        "plan" => {
            let (box_name, target) = rest.rsplit_once('@')?;
            NodeId::Plan {
                box_name: nonempty(box_name)?,
                target: Target::named(target)?,
            }
        }
        "layer" => {
            if let Some(b) = rest.strip_suffix("#setup") {
                NodeId::layer(&nonempty(b)?, LayerSlot::Setup)
            } else if let Some(b) = rest.strip_suffix("#init") {
                NodeId::layer(&nonempty(b)?, LayerSlot::Init)
            } else {
                let (box_name, candy) = rest.split_once('/')?;
                NodeId::layer(&nonempty(box_name)?, LayerSlot::Candy(nonempty(candy)?))
            }
        }
        "base" => NodeId::Base {
            reference: nonempty(rest)?,
        },
        _ => return None,
    })
}

impl FromStr for NodeId {
    type Err = BadNodeId;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse(s).ok_or_else(|| BadNodeId(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(uid: u32, home: &str) -> User {
        User {
            name: "u".into(),
            uid,
            gid: uid,
            home: home.into(),
            adopted: false,
        }
    }

    /// The texts are key inputs: pinned exactly as schema 1 wrote them.
    #[test]
    fn display_is_the_id_text_of_key_schema_1() {
        let cases: Vec<(NodeId, &str)> = vec![
            (
                NodeId::Source(SourceId::Candy("jq".into())),
                "source:candy/jq",
            ),
            (
                NodeId::Source(SourceId::Box("hello".into())),
                "source:box/hello",
            ),
            (
                NodeId::Source(SourceId::LocalPkg {
                    candy: "tool".into(),
                    format: "deb".into(),
                }),
                "source:localpkg/tool/deb",
            ),
            (NodeId::fragment("hello", "jq"), "fragment:hello/jq"),
            (NodeId::containerfile("hello", false), "containerfile:hello"),
            (
                NodeId::containerfile("hello", true),
                "containerfile:hello+artifacts",
            ),
            (
                NodeId::builder_stage("app", "npm", "node-builder", &user(1000, "/home/user")),
                "builder-stage:app/npm@node-builder",
            ),
            (
                NodeId::builder_stage("app", "npm", "ns.builder", &user(1001, "/home/u")),
                "builder-stage:app/npm@ns.builder~1001:1001:/home/u",
            ),
            (
                NodeId::local_pkg("tool", "rpm", "fedora"),
                "local-pkg:tool/rpm@fedora",
            ),
            (
                NodeId::local_pkg("tool", "deb", "docker.io/library/debian@sha256:ab"),
                "local-pkg:tool/deb@docker.io/library/debian@sha256:ab",
            ),
            (
                NodeId::Rootfs {
                    box_name: "arch".into(),
                },
                "rootfs:arch",
            ),
            (NodeId::image("hello"), "image:hello"),
            (
                NodeId::layer("hello", LayerSlot::Candy("nodejs".into())),
                "layer:hello/nodejs",
            ),
            (
                NodeId::layer("hello", LayerSlot::Candy("github.com/o/r/c".into())),
                "layer:hello/github.com/o/r/c",
            ),
            (NodeId::layer("base", LayerSlot::Setup), "layer:base#setup"),
            (NodeId::layer("hello", LayerSlot::Init), "layer:hello#init"),
            (
                NodeId::Base {
                    reference: "docker.io/library/debian:12".into(),
                },
                "base:docker.io/library/debian:12",
            ),
            (
                NodeId::Plan {
                    box_name: "hello".into(),
                    target: Target::K8s,
                },
                "plan:hello@k8s",
            ),
        ];
        for (id, text) in cases {
            assert_eq!(id.to_string(), text);
            assert_eq!(text.parse::<NodeId>().as_ref(), Ok(&id), "{text}");
        }
    }

    #[test]
    fn remote_candy_keys_round_trip() {
        for id in [
            NodeId::fragment("hello", "github.com/org/repo/candy/jq:v1"),
            NodeId::local_pkg("github.com/org/repo/tool", "pkg", "ns.arch"),
            NodeId::builder_stage(
                "github.com/org/repo/app",
                "cargo",
                "builder",
                &user(0, "/root"),
            ),
            NodeId::Source(SourceId::LocalPkg {
                candy: "github.com/o/r/t".into(),
                format: "deb".into(),
            }),
        ] {
            assert_eq!(id.to_string().parse::<NodeId>(), Ok(id));
        }
    }

    #[test]
    fn junk_is_refused() {
        for s in [
            "",
            "image:",
            "image",
            "pictures:x",
            "plan:hello@mars",
            "plan:hello",
            "source:candy/",
            "source:vocab/x",
            "fragment:hello",
            "builder-stage:app@b",
            "builder-stage:app/npm@b~x:1:/h",
            "local-pkg:tool",
            "local-pkg:tool/deb",
            "local-pkg:tool/deb@",
        ] {
            assert!(s.parse::<NodeId>().is_err(), "{s}");
        }
    }

    #[test]
    fn kinds_and_boxes() {
        assert_eq!(NodeId::image("a").kind(), NodeKind::Image);
        assert_eq!(
            NodeId::local_pkg("c", "deb", "base").kind(),
            NodeKind::LocalPkg
        );
        assert_eq!(NodeId::fragment("a", "c").box_name(), Some("a"));
        assert_eq!(NodeId::local_pkg("c", "deb", "base").box_name(), None);
    }
}

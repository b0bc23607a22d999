//! Runner requests for command-running nodes: builder stages, local
//! packages and bootstrapped root filesystems.
//!
//! What each node builds is vocabulary knowledge and comes from
//! [`charly_rules::spec`] as a plain spec; this module only adds what the
//! engine owns (the node id, its key, the build context). Spec errors
//! become the [`ExecError`]s they were before the specs moved (see
//! `crate::ctx`).

use crate::ctx::{Ctx, ExecError};
use crate::runners::{LocalPkgRequest, RootfsRequest, StageRequest};
use charly_rules::resolve::{ResolvedBox, User};
use charly_rules::spec;

/// The request to run the builder stage of `candy` with `builder` in box
/// `image_box`'s image, for `user` (with box `b`'s vocabulary).
#[allow(clippy::too_many_arguments)]
pub fn stage_request(
    ctx: &Ctx<'_>,
    b: &ResolvedBox,
    candy: &str,
    builder: &str,
    image_box: &str,
    user: &User,
    node: &str,
    key: &str,
) -> Result<StageRequest<'static>, ExecError> {
    let s = spec::builder_stage(
        ctx.project,
        ctx.resolution,
        b,
        candy,
        builder,
        image_box,
        user,
    )?;
    Ok(StageRequest {
        log: Default::default(),
        node: node.to_string(),
        key: key.to_string(),
        containerfile: s.containerfile,
        context: ctx.project.root.clone(),
        builder_image: s.builder_image,
        export: s.export,
        owner: (user.uid, user.gid),
        out: Default::default(),
    })
}

/// The request to build a candy's local package for a format.
pub fn local_pkg_request(
    ctx: &Ctx<'_>,
    b: &ResolvedBox,
    candy: &str,
    format: &str,
    node: &str,
    key: &str,
) -> Result<LocalPkgRequest<'static>, ExecError> {
    let s = spec::local_pkg(ctx.project, ctx.resolution, b, candy, format)?;
    Ok(LocalPkgRequest {
        log: Default::default(),
        node: node.to_string(),
        key: key.to_string(),
        format: s.format,
        source: s.source,
        image: s.image,
        script: s.script,
        glob: s.glob,
        out: Default::default(),
    })
}

/// The request to bootstrap a box's root filesystem (`from: builder:debootstrap`).
pub fn rootfs_request(
    ctx: &Ctx<'_>,
    b: &ResolvedBox,
    builder: &str,
    node: &str,
    key: &str,
) -> Result<RootfsRequest<'static>, ExecError> {
    let s = spec::rootfs(ctx.project, b, builder)?;
    Ok(RootfsRequest {
        log: Default::default(),
        node: node.to_string(),
        key: key.to_string(),
        builder: s.builder,
        suite: s.suite,
        mirror: s.mirror,
        variant: s.variant,
        include: s.include,
        out: Default::default(),
    })
}

//! A plugin process never outlives charly, even when charly is SIGKILLed
//! (no drop, no `GRPCController.Shutdown` runs then).
//!
//! On Linux the child asks the kernel for `SIGKILL` when its parent dies
//! (`prctl(PR_SET_PDEATHSIG, SIGKILL)`), between fork and exec, in a
//! `pre_exec` hook. The setting survives `execve` (it is only cleared for
//! set-user-ID/capability binaries, which a plugin is not), so a wrapper
//! script that `exec`s the real plugin keeps it too.
//!
//! Two details of the kernel's rule shape the host:
//!
//! * **The race.** If charly dies after the fork but before the child's
//!   `prctl`, no signal ever comes: the child was already reparented. So
//!   after the `prctl` the child compares `getppid()` with charly's pid
//!   (taken before the fork) and, when they differ, fails the spawn instead
//!   of exec-ing the plugin (std reports a `pre_exec` error by `_exit`ing
//!   the child).
//! * **The "parent" is the thread that forked**, not the process: the signal
//!   comes when that *thread* exits. charly starts plugins from wherever a
//!   call needs one first (rayon workers, scoped threads of a walk, tokio
//!   workers), and such a thread may end long before the plugin is done
//!   with. So [`crate::Plugin::start`] forks from a thread of its own (the
//!   plugin's *keeper*), which only waits until the [`crate::Plugin`] is
//!   dropped and the process reaped: the plugin dies with charly or with
//!   its `Plugin`, never with the thread that happened to ask first.
//!
//! The workspace forbids `unsafe`; this crate denies it instead, and the
//! one function below allows it, for `pre_exec` (std offers no safe way to
//! run code in the child before exec). Elsewhere than Linux nothing is set
//! (the drop of a [`crate::Plugin`] still shuts the plugin down and kills
//! it).

use tokio::process::Command;

/// Makes the child `cmd` spawns die (SIGKILL) when the spawning thread or
/// charly itself ends, or refuse to start when charly is already gone.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
pub(crate) fn die_with_parent(cmd: &mut Command) {
    use rustix::process::{Pid, Signal, getppid, set_parent_process_death_signal};
    let parent: Pid = rustix::process::getpid();
    // SAFETY: the hook runs in the forked child before exec, where only
    // async-signal-safe work is allowed. It makes two raw system calls
    // through rustix (prctl and getppid: no allocation, no lock, no libc
    // state), compares two integers, and builds its errors from errno values
    // (`std::io::Error::from_raw_os_error`, which does not allocate). It
    // captures only a `Pid` (plain data).
    unsafe {
        cmd.pre_exec(move || {
            set_parent_process_death_signal(Some(Signal::KILL))?;
            if getppid() != Some(parent) {
                // charly died between fork and prctl: nobody would ever
                // send the signal, so do not start the plugin at all.
                return Err(rustix::io::Errno::SRCH.into());
            }
            Ok(())
        });
    }
}

/// Elsewhere: nothing (see the module documentation).
#[cfg(not(target_os = "linux"))]
pub(crate) fn die_with_parent(_cmd: &mut Command) {}

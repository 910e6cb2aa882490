//! `orion bench local`: the local core in volatile mode next to tmpfs, same calls,
//! same run. Placeholder filled in below.
use anyhow::Result;
pub fn run(_ops: usize, _json: bool) -> Result<()> {
    anyhow::bail!("not yet")
}

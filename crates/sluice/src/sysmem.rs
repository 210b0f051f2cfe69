//! How much memory this process may use: the machine's `MemAvailable`, and the limit of the
//! memory cgroup the process runs in (v1 or v2; a container's limit), whichever is smaller.
//! `--memory auto` plans its budget from it.

use std::path::{Path, PathBuf};

/// The memory a process may take, as far as can be told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Available {
    /// `MemAvailable` of `/proc/meminfo`.
    pub host_bytes: u64,
    /// The memory cgroup's room, when a cgroup of this process or one of its ancestors sets a
    /// limit.
    pub cgroup: Option<CgroupRoom>,
}

/// A memory cgroup's limit and what is left of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupRoom {
    /// The directory of the cgroup (or ancestor) whose limit leaves the least room.
    pub dir: PathBuf,
    /// Its limit (`memory.max` in v2, `memory.limit_in_bytes` in v1).
    pub limit_bytes: u64,
    /// What it holds that cannot simply be dropped: its usage less its inactive file pages
    /// (the page cache the kernel reclaims first), as container runtimes count a working set.
    pub used_bytes: u64,
}

impl CgroupRoom {
    /// The limit less what is used.
    pub fn room(&self) -> u64 {
        self.limit_bytes.saturating_sub(self.used_bytes)
    }
}

impl Available {
    /// The smaller of the host's available memory and the cgroup's room (what the tests check
    /// the reading against).
    #[cfg(test)]
    fn bytes(&self) -> u64 {
        match &self.cgroup {
            Some(c) => c.room().min(self.host_bytes),
            None => self.host_bytes,
        }
    }

    /// The budget `--memory auto` takes: what is available less headroom. On the host, 10%
    /// of it and at least 512 MiB for the rest of the system; where a cgroup's limit is the
    /// smaller, 10% and at least 64 MiB (the rest of the system is outside the cgroup; what
    /// sluice allocates beyond its budget, its code and runtime, stays under that).
    pub fn auto_budget(&self) -> u64 {
        let host = self
            .host_bytes
            .saturating_sub((self.host_bytes / 10).max(512 << 20));
        match &self.cgroup {
            Some(c) if c.room() < self.host_bytes => {
                let room = c.room();
                room.saturating_sub((room / 10).max(64 << 20)).min(host)
            }
            _ => host,
        }
    }
}

/// Reads the memory this process may use from `/proc` and `/sys/fs/cgroup`.
pub fn available() -> Result<Available, String> {
    available_under(Path::new("/"))
}

/// [`available`] with every file read below `root` (tests give a directory laid out like `/`).
pub(crate) fn available_under(root: &Path) -> Result<Available, String> {
    let at = |p: &str| root.join(p.trim_start_matches('/'));
    let meminfo = std::fs::read_to_string(at("/proc/meminfo"))
        .map_err(|e| format!("cannot read /proc/meminfo: {e}"))?;
    let kb = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .ok_or("no MemAvailable in /proc/meminfo")?;
    let cgroup = std::fs::read_to_string(at("/proc/self/cgroup"))
        .ok()
        .zip(std::fs::read_to_string(at("/proc/self/mountinfo")).ok())
        .and_then(|(cg, mi)| cgroup_room(root, &cg, &mi));
    Ok(Available {
        host_bytes: kb.saturating_mul(1024),
        cgroup,
    })
}

/// Which cgroup version holds the memory controller.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

/// The tightest memory limit among this process's cgroup and its ancestors, from the text of
/// `/proc/self/cgroup` and `/proc/self/mountinfo`. `None` when no level sets one.
fn cgroup_room(root: &Path, cgroup: &str, mountinfo: &str) -> Option<CgroupRoom> {
    // v1: "N:memory,...:/path"; v2: "0::/path". A v1 memory controller wins where both are.
    let mut path = None;
    for line in cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (_, controllers, p) = (f.next()?, f.next()?, f.next()?);
        if controllers.split(',').any(|c| c == "memory") {
            path = Some((Version::V1, p));
            break;
        }
        if controllers.is_empty() && path.is_none() {
            path = Some((Version::V2, p));
        }
    }
    let (version, cg_path) = path?;
    // mountinfo: "id parent maj:min root mountpoint opts [optional...] - fstype source superopts".
    let (mount_root, mount_point) = mountinfo.lines().find_map(|line| {
        let (pre, post) = line.split_once(" - ")?;
        let pre: Vec<&str> = pre.split(' ').collect();
        let post: Vec<&str> = post.split(' ').collect();
        let (fstype, superopts) = (*post.first()?, *post.get(2).unwrap_or(&""));
        let wanted = match version {
            Version::V1 => fstype == "cgroup" && superopts.split(',').any(|o| o == "memory"),
            Version::V2 => fstype == "cgroup2",
        };
        wanted.then(|| (pre.get(3).copied(), pre.get(4).copied()))
    })?;
    let (mount_root, mount_point) = (mount_root?, unescape(mount_point?));
    // The cgroup's directory: its path below the mount's root, under the mount point.
    let rel = cg_path
        .strip_prefix(mount_root)
        .or_else(|| (mount_root == "/").then_some(cg_path))?;
    let top = root.join(mount_point.trim_start_matches('/'));
    let mut dir = top.join(rel.trim_start_matches('/'));
    let mut best: Option<CgroupRoom> = None;
    loop {
        if let Some(level) = level_room(&dir, version)
            && best.as_ref().is_none_or(|b| level.room() < b.room())
        {
            best = Some(level);
        }
        if dir == top || !dir.pop() || !dir.starts_with(&top) {
            break;
        }
    }
    best
}

/// One cgroup directory's limit and use, when it sets a limit.
fn level_room(dir: &Path, version: Version) -> Option<CgroupRoom> {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
    let (limit, usage, inactive_keys): (&str, &str, &[&str]) = match version {
        Version::V1 => (
            "memory.limit_in_bytes",
            "memory.usage_in_bytes",
            &["total_inactive_file", "inactive_file"],
        ),
        Version::V2 => ("memory.max", "memory.current", &["inactive_file"]),
    };
    // v2 writes "max" for no limit; v1 a number near 2^63 rounded to the page.
    let limit: u64 = read(limit)?.trim().parse().ok()?;
    if limit >= 1 << 60 {
        return None;
    }
    let usage: u64 = read(usage).and_then(|u| u.trim().parse().ok()).unwrap_or(0);
    let stat = read("memory.stat").unwrap_or_default();
    let inactive = inactive_keys
        .iter()
        .find_map(|k| {
            stat.lines().find_map(|l| {
                let (name, v) = l.split_once(' ')?;
                (name == *k).then(|| v.trim().parse::<u64>().ok()).flatten()
            })
        })
        .unwrap_or(0);
    Some(CgroupRoom {
        dir: dir.to_path_buf(),
        limit_bytes: limit,
        used_bytes: usage.saturating_sub(inactive),
    })
}

/// A mountinfo path with its octal escapes (`\040` for a space) undone.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake `/` with a meminfo of 24 GiB available and the given cgroup files.
    fn root(cgroup: &str, mountinfo: &str, files: &[(&str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let put = |p: &str, text: &str| {
            let p = d.path().join(p.trim_start_matches('/'));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        put(
            "/proc/meminfo",
            "MemTotal: 25165824 kB\nMemAvailable: 25165824 kB\n",
        );
        put("/proc/self/cgroup", cgroup);
        put("/proc/self/mountinfo", mountinfo);
        for (p, t) in files {
            put(p, t);
        }
        d
    }

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    #[test]
    fn a_v1_container_limit_bounds_the_auto_budget() {
        let d = root(
            "4:memory:/docker/abc\n1:cpu:/\n0::/\n",
            "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n\
             35 31 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n",
            &[
                (
                    "/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes",
                    "209715200\n",
                ),
                (
                    "/sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes",
                    "73400320\n",
                ),
                (
                    "/sys/fs/cgroup/memory/docker/abc/memory.stat",
                    "cache 1\ntotal_inactive_file 20971520\n",
                ),
                (
                    "/sys/fs/cgroup/memory/docker/memory.limit_in_bytes",
                    "9223372036854771712\n",
                ),
                (
                    "/sys/fs/cgroup/memory/memory.limit_in_bytes",
                    "9223372036854771712\n",
                ),
            ],
        );
        let a = available_under(d.path()).unwrap();
        assert_eq!(a.host_bytes, 24 * GIB);
        let c = a.cgroup.clone().unwrap();
        assert_eq!(c.limit_bytes, 200 * MIB);
        // 70 MiB used, 20 of it inactive page cache: 50 MiB held, 150 MiB of room.
        assert_eq!(c.used_bytes, 50 * MIB);
        assert_eq!(a.bytes(), 150 * MIB);
        // 150 MiB less 64 MiB of headroom; it was 24 GiB less 10% before.
        assert_eq!(a.auto_budget(), 86 * MIB);
    }

    #[test]
    fn the_tightest_ancestor_of_a_v2_cgroup_wins() {
        let d = root(
            "0::/user.slice/job\n",
            "40 23 0:35 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n",
            &[
                ("/sys/fs/cgroup/user.slice/job/memory.max", "max\n"),
                ("/sys/fs/cgroup/user.slice/job/memory.current", "1000\n"),
                ("/sys/fs/cgroup/user.slice/memory.max", "4294967296\n"),
                ("/sys/fs/cgroup/user.slice/memory.current", "1073741824\n"),
                (
                    "/sys/fs/cgroup/user.slice/memory.stat",
                    "anon 1\ninactive_file 0\n",
                ),
            ],
        );
        let a = available_under(d.path()).unwrap();
        let c = a.cgroup.clone().unwrap();
        assert!(c.dir.ends_with("sys/fs/cgroup/user.slice"), "{c:?}");
        assert_eq!(a.bytes(), 3 * GIB);
        assert_eq!(a.auto_budget(), 3 * GIB - 3 * GIB / 10);
    }

    #[test]
    fn no_limit_or_no_cgroup_leaves_the_host_figure() {
        for (cg, mi, files) in [
            (
                "0::/\n",
                "40 23 0:35 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
                vec![("/sys/fs/cgroup/memory.max", "max\n")],
            ),
            ("0::/\n", "", vec![]),
            ("", "", vec![]),
        ] {
            let d = root(cg, mi, &files);
            let a = available_under(d.path()).unwrap();
            assert_eq!(a.cgroup, None);
            assert_eq!(a.auto_budget(), 24 * GIB - 24 * GIB / 10);
        }
    }

    #[test]
    fn mount_points_with_spaces_are_unescaped() {
        assert_eq!(unescape("/a\\040b"), "/a b");
        assert_eq!(unescape("/plain\\"), "/plain\\");
        assert_eq!(unescape("/x\\04"), "/x\\04");
    }
}

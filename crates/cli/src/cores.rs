//! The default thread count: one per physical core this process may run on.
//! Two hyper-threads of a core share its vector units, so a second thread per
//! core mostly adds synchronization to the compute-bound kernels.

use std::collections::HashSet;

/// Physical cores among the CPUs this process may use; all usable CPUs where
/// the topology cannot be read (non-Linux, restricted /sys).
pub fn physical_cores() -> usize {
    let logical = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    linux_physical_cores().map_or(logical, |n| n.clamp(1, logical))
}

fn linux_physical_cores() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let list = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
    let mut cores = HashSet::new();
    for cpu in parse_cpu_list(list.trim())? {
        let read = |f: &str| {
            std::fs::read_to_string(format!("/sys/devices/system/cpu/cpu{cpu}/topology/{f}"))
                .ok()
                .map(|s| s.trim().to_string())
        };
        cores.insert((read("physical_package_id")?, read("core_id")?));
    }
    (!cores.is_empty()).then_some(cores.len())
}

/// "0-3,8,10-11" -> [0, 1, 2, 3, 8, 10, 11].
fn parse_cpu_list(s: &str) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.parse::<usize>().ok()?..=b.parse::<usize>().ok()?),
            None => out.push(part.parse().ok()?),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_lists_parse() {
        assert_eq!(super::parse_cpu_list("0-3,8,10-11"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(super::parse_cpu_list("5"), Some(vec![5]));
        assert_eq!(super::parse_cpu_list("x"), None);
        assert!(super::physical_cores() >= 1);
    }
}

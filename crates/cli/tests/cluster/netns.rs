//! Hosts as network namespaces that a test creates: one per host, each with a veth
//! link to a bridge in a namespace of its own, on a /24 of the test's own. Deleted when
//! dropped (after the daemons in them), and before creation (a run killed before it
//! could clean up may have left the names behind).

use std::process::{Command, Stdio};

fn ip(args: &[&str]) {
    let st = Command::new("ip").args(args).status().expect("running ip");
    assert!(st.success(), "ip {args:?} failed");
}

pub struct Network {
    tag: String,
    hosts: Vec<(&'static str, &'static str)>,
}

impl Network {
    /// Creates the hosts, each (name, address on the test's /24).
    pub fn create(hosts: &[(&'static str, &'static str)]) -> Network {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        assert!(root, "this test creates network namespaces: run it as root");
        let tag = format!("{}", std::process::id() % 100_000);
        let n = Network {
            tag,
            hosts: hosts.to_vec(),
        };
        n.remove();
        let hub = n.ns("hub");
        ip(&["netns", "add", &hub]);
        ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &hub, "link", "set", "br0", "up"]);
        for &(host, addr) in hosts {
            let ns = n.ns(host);
            let (inner, outer) = (n.link(host), format!("h{host}{}", n.tag));
            ip(&["netns", "add", &ns]);
            ip(&[
                "link", "add", &inner, "type", "veth", "peer", "name", &outer,
            ]);
            ip(&["link", "set", &inner, "netns", &ns]);
            ip(&["link", "set", &outer, "netns", &hub]);
            ip(&["-n", &hub, "link", "set", &outer, "master", "br0"]);
            ip(&["-n", &hub, "link", "set", &outer, "up"]);
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                &inner,
            ]);
            ip(&["-n", &ns, "link", "set", &inner, "up"]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
        }
        n
    }

    /// The namespace of `host`.
    pub fn ns(&self, host: &str) -> String {
        format!("orion-{host}-{}", self.tag)
    }

    /// The host's end of its link (in its namespace).
    fn link(&self, host: &str) -> String {
        format!("v{host}{}", self.tag)
    }

    /// Takes a host's link down or up: it is cut off from every other host.
    pub fn set_link(&self, host: &str, up: bool) {
        let state = if up { "up" } else { "down" };
        ip(&["-n", &self.ns(host), "link", "set", &self.link(host), state]);
    }

    /// Deletes the namespaces (with the links in them), and links left in this one by
    /// a setup that stopped halfway.
    fn remove(&self) {
        let quiet = |args: &[&str]| {
            let _ = Command::new("ip").args(args).stderr(Stdio::null()).status();
        };
        quiet(&["netns", "del", &self.ns("hub")]);
        for &(host, _) in &self.hosts {
            quiet(&["netns", "del", &self.ns(host)]);
            quiet(&["link", "del", &self.link(host)]);
        }
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        self.remove();
    }
}

/// `orion <args>` with `--config cfg` inside network namespace `ns`, fed `stdin`; a
/// run that hangs is killed after two minutes (its command then fails, with the logs).
pub fn orion_on(
    ns: &str,
    cfg: &std::path::Path,
    args: &[&str],
    stdin: &[u8],
) -> std::process::Output {
    use std::io::Write;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, super::ORION])
        .args(&args[..1])
        .arg("--config")
        .arg(cfg)
        .args(&args[1..])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running orion on a host");
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let pid = child.id();
    let (done, watch) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if watch
            .recv_timeout(std::time::Duration::from_secs(120))
            .is_err()
        {
            // SAFETY: kill(2) takes any PID; this one is our child's, which has run for
            // 120 s without being reaped (were it reaped an instant ago, its PID would
            // not have been reused yet).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    });
    let out = child.wait_with_output().unwrap();
    let _ = done.send(());
    let _ = watchdog.join();
    out
}

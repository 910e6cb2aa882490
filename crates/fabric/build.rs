//! Compiles the C shim over libfabric's inline calls (libfabric is opened at run time).
fn main() {
    println!("cargo:rerun-if-changed=src/ofi/shim.c");
    let header = std::path::Path::new("/usr/include/rdma/fabric.h");
    let found = pkg_config_cflags("libfabric");
    if found.is_none() && !header.exists() {
        panic!(
            "libfabric headers not found: install libfabric-dev (Debian: `apt-get install \
             libfabric-dev`; scripts/setup does this)"
        );
    }
    let mut build = cc::Build::new();
    build
        .file("src/ofi/shim.c")
        .warnings(true)
        .flag_if_supported("-Wno-unused-parameter");
    if let Some(flags) = found {
        for f in flags.split_whitespace() {
            if let Some(dir) = f.strip_prefix("-I") {
                build.include(dir);
            }
        }
    }
    build.compile("orion_fi_shim");
    // libfabric itself is opened with dlopen on first use (see shim.c): linking it
    // would run its providers' constructors in every process at start.
    println!("cargo:rustc-link-lib=dl");
}

fn pkg_config_cflags(lib: &str) -> Option<String> {
    let out = std::process::Command::new("pkg-config")
        .args(["--cflags", lib])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

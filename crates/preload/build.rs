//! Compiles the C half of the library: the variadic exec calls (see `src/variadic.c`).
fn main() {
    println!("cargo:rerun-if-changed=src/variadic.c");
    cc::Build::new()
        .file("src/variadic.c")
        .warnings(true)
        .compile("orion_preload_variadic");
    // The unwinder linked in whole, so that the library needs no libgcc_s.so: that
    // library's constructor asks the CPU for its features with `cpuid`, which traps
    // to the hypervisor on a VM (7 µs each; 0.1 ms per process on the development
    // VM), and every process under `orion run` loads this library. Its symbols stay
    // local: a cdylib exports only its own `#[no_mangle]` functions, so the
    // program's own unwinder (a C++ program's libgcc_s) is untouched.
    if std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu") {
        println!("cargo:rustc-link-lib=static:+whole-archive,-bundle=gcc_eh");
    }
}

//! Compiles the C half of the library: the variadic exec calls (see `src/variadic.c`).
fn main() {
    println!("cargo:rerun-if-changed=src/variadic.c");
    cc::Build::new()
        .file("src/variadic.c")
        .warnings(true)
        .compile("orion_preload_variadic");
}

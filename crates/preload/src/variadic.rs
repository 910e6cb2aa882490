//! execl, execlp and execle: variadic, so written in C (`variadic.c`). A C symbol
//! in a Rust cdylib is not exported (rustc's export list names Rust items only), so
//! each exported name here is a naked function whose whole body is a jump to the C
//! one: a jump leaves the caller's registers and stack, and so its variadic
//! arguments, exactly as they were.

extern "C" {
    fn orion_execl();
    fn orion_execlp();
    fn orion_execle();
}

/// Defines `pub extern "C" fn $name` as a jump to `$target`.
macro_rules! jump_to {
    ($name:ident, $target:ident) => {
        #[no_mangle]
        #[unsafe(naked)]
        pub unsafe extern "C" fn $name() {
            // SAFETY: the body is one tail jump to a C function with the same
            // (variadic) prototype; nothing here touches registers or the stack.
            #[cfg(target_arch = "x86_64")]
            core::arch::naked_asm!("jmp {}", sym $target);
            #[cfg(target_arch = "aarch64")]
            core::arch::naked_asm!("b {}", sym $target);
        }
    };
}

jump_to!(execl, orion_execl);
jump_to!(execlp, orion_execlp);
jump_to!(execle, orion_execle);

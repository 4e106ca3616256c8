//! dusk-macros: placeholder until the kernel-language issue lands.

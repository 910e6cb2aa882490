//! `orion fsck`: reads a file system's pools without changing them and lists what is
//! inconsistent.

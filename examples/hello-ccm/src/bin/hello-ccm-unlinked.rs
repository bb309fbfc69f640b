//! The linker pitfall, kept as a regression check: this binary's package depends on the hello
//! provider (see Cargo.toml) but this file never references it, so the provider is not linked
//! and not registered.

fn main() {
    match cloud_provider::Registry::global() {
        Ok(registry) => println!("registered providers: {}", registry.names().join(", ")),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    }
}

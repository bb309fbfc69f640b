//! Two crates registering one name is caught at startup, naming both (upstream
//! `k8s.io/cloud-provider/plugins.go` `RegisterCloudProvider` `klog.Fatalf`s without saying
//! who registered first). This test binary registers "twice" two times through the macro,
//! as two provider crates would.

use std::sync::Arc;

use cloud_provider::{CloudConfig, CloudProvider, CloudResult, Registry, register_cloud_provider};

struct Twice;

impl CloudProvider for Twice {
    fn provider_name(&self) -> &str {
        "twice"
    }
}

fn new_twice(_config: Option<&CloudConfig>) -> CloudResult<Arc<dyn CloudProvider>> {
    Ok(Arc::new(Twice))
}

mod vendor_a {
    cloud_provider::register_cloud_provider!("twice", super::new_twice);
}

register_cloud_provider!("twice", new_twice);

#[test]
fn a_name_registered_by_two_crates_is_an_error_naming_both() {
    let err = Registry::global().expect_err("duplicate names must be refused");
    let message = err.to_string();
    assert!(
        message.starts_with("cloud provider \"twice\" is registered twice: by "),
        "{message}"
    );
    assert!(
        message.contains("duplicate_registration::vendor_a ("),
        "{message}"
    );
    assert!(message.contains("duplicate_registration ("), "{message}");
    assert!(message.contains("duplicate_registration.rs:"), "{message}");
    // Lookups through the global entry point fail the same way instead of picking one.
    assert!(cloud_provider::init_cloud_provider("twice", None).is_err());
}

//! Providers are found by name once linked (upstream `k8s.io/cloud-provider/plugins.go`
//! `GetCloudProvider`, `InitCloudProvider`).

use cloud_provider::{Registry, RegistryError, init_cloud_provider};

#[test]
fn every_linked_provider_is_registered_by_name() {
    let registry = Registry::global().unwrap();
    assert_eq!(registry.names(), ["fake", "hello"]);
}

#[test]
fn an_unknown_name_is_an_error_listing_the_linked_providers() {
    let err = init_cloud_provider("gce", None).err().unwrap();
    assert!(matches!(err, RegistryError::UnknownProvider { .. }));
    assert_eq!(
        err.to_string(),
        "unknown cloud provider \"gce\"; registered providers: fake, hello"
    );
}

#[test]
fn external_and_empty_names_build_no_provider() {
    assert!(init_cloud_provider("external", None).unwrap().is_none());
    assert!(init_cloud_provider("", None).unwrap().is_none());
}

#[test]
fn without_a_cloud_config_flag_the_factory_gets_none() {
    // The fake without a config is an empty cloud; hello without a config has no instances.
    let fake = init_cloud_provider("fake", None).unwrap().unwrap();
    assert_eq!(fake.provider_name(), "fake");
    let hello = init_cloud_provider("hello", None).unwrap().unwrap();
    assert_eq!(hello.provider_name(), "hello");
}

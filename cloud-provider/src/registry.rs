//! Compile-time provider registration with [`inventory`], and lookup by name.
//!
//! A provider crate registers itself once with [`register_cloud_provider!`](crate::register_cloud_provider):
//!
//! ```
//! use std::sync::Arc;
//! use cloud_provider::{register_cloud_provider, CloudConfig, CloudProvider, CloudResult};
//!
//! struct Mine;
//! impl CloudProvider for Mine {
//!     fn provider_name(&self) -> &str { "mine" }
//! }
//!
//! fn new_mine(_config: Option<&CloudConfig>) -> CloudResult<Arc<dyn CloudProvider>> {
//!     Ok(Arc::new(Mine))
//! }
//!
//! register_cloud_provider!("mine", new_mine);
//!
//! let registry = cloud_provider::Registry::global().unwrap();
//! assert!(registry.names().contains(&"mine"));
//! let cloud = registry.init_cloud_provider("mine", None).unwrap().unwrap();
//! assert_eq!(cloud.provider_name(), "mine");
//! ```
//!
//! **The linker pitfall.** A crate that is only listed in `Cargo.toml` and never referenced in
//! code is not linked, so its registration never runs. The binary must reference it:
//! `use my_provider as _;`.

use std::{
    collections::BTreeMap,
    fmt,
    path::{Path, PathBuf},
    sync::Arc,
};

use crate::{CloudError, CloudProvider, CloudResult, well_known::NO_PROVIDER_NAMES};

/// Builds a provider from the `--cloud-config` file, which is `None` when the flag is absent.
pub type ProviderFactory = fn(Option<&CloudConfig>) -> CloudResult<Arc<dyn CloudProvider>>;

/// The contents of the `--cloud-config` file, with its path for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudConfig {
    path: PathBuf,
    contents: Vec<u8>,
}

impl CloudConfig {
    /// A config read from `path`.
    pub fn new(path: impl Into<PathBuf>, contents: impl Into<Vec<u8>>) -> Self {
        CloudConfig {
            path: path.into(),
            contents: contents.into(),
        }
    }

    /// Reads the file at `path`.
    pub fn read(path: impl Into<PathBuf>) -> std::io::Result<Self> {
        let path = path.into();
        let contents = std::fs::read(&path)?;
        Ok(CloudConfig { path, contents })
    }

    /// Where the config came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The raw bytes.
    pub fn contents(&self) -> &[u8] {
        &self.contents
    }

    /// The contents as UTF-8, or an error naming the file.
    pub fn as_str(&self) -> CloudResult<&str> {
        std::str::from_utf8(&self.contents).map_err(|e| {
            CloudError::context(
                format!("cloud config {} is not UTF-8", self.path.display()),
                e,
            )
        })
    }
}

/// One provider's registration, placed in the binary by [`register_cloud_provider!`](crate::register_cloud_provider).
#[derive(Debug)]
pub struct ProviderRegistration {
    name: &'static str,
    factory: ProviderFactory,
    module_path: &'static str,
    file: &'static str,
    line: u32,
}

impl ProviderRegistration {
    /// A registration. Use the macro instead, which fills in where it was made.
    pub const fn new(
        name: &'static str,
        factory: ProviderFactory,
        module_path: &'static str,
        file: &'static str,
        line: u32,
    ) -> Self {
        ProviderRegistration {
            name,
            factory,
            module_path,
            file,
            line,
        }
    }

    /// The name it is registered under (the `--cloud-provider` value).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Where it was registered: `module (file:line)`.
    pub fn origin(&self) -> String {
        format!("{} ({}:{})", self.module_path, self.file, self.line)
    }
}

inventory::collect!(ProviderRegistration);

/// Registers a cloud provider under a name, at compile time. Call it once in the provider crate,
/// at module level, with the name and a [`ProviderFactory`].
///
/// See the [`registry`](crate::registry) module for an example and the linker pitfall.
#[macro_export]
macro_rules! register_cloud_provider {
    ($name:expr, $factory:expr $(,)?) => {
        $crate::__private::inventory::submit! {
            $crate::registry::ProviderRegistration::new(
                $name,
                $factory,
                ::core::module_path!(),
                ::core::file!(),
                ::core::line!(),
            )
        }
    };
}

/// Why a provider could not be looked up or built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// Two registrations share a name.
    #[error("cloud provider {name:?} is registered twice: by {first} and by {second}")]
    Duplicate {
        /// The shared name.
        name: &'static str,
        /// Where the first registration was made.
        first: String,
        /// Where the second registration was made.
        second: String,
    },
    /// A provider registered under a name that means "no provider".
    #[error("cloud provider registered by {origin} uses the reserved name {name:?}")]
    ReservedName {
        /// The name.
        name: &'static str,
        /// Where it was registered.
        origin: String,
    },
    /// No provider has this name.
    #[error("unknown cloud provider {name:?}; registered providers: {}", RegisteredNames(.registered))]
    UnknownProvider {
        /// The name asked for.
        name: String,
        /// The names that are registered, sorted.
        registered: Vec<&'static str>,
    },
    /// The `--cloud-config` file could not be read.
    #[error("could not read cloud config {} for cloud provider {provider:?}: {source}", path.display())]
    ConfigUnreadable {
        /// The provider.
        provider: String,
        /// The config path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The provider's factory failed.
    #[error("could not init cloud provider {provider:?} (cloud config: {}): {source}", ConfigPath(.config_path.as_deref()))]
    FactoryFailed {
        /// The provider.
        provider: String,
        /// The config path, if one was given.
        config_path: Option<PathBuf>,
        /// The factory's error.
        #[source]
        source: CloudError,
    },
}

struct RegisteredNames<'a>(&'a [&'static str]);

impl fmt::Display for RegisteredNames<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none (is the provider crate linked? add `use my_provider as _;`)");
        }
        f.write_str(&self.0.join(", "))
    }
}

struct ConfigPath<'a>(Option<&'a Path>);

impl fmt::Display for ConfigPath<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(path) => write!(f, "{}", path.display()),
            None => f.write_str("none"),
        }
    }
}

/// The providers linked into this binary, by name.
#[derive(Debug, Clone)]
pub struct Registry {
    providers: BTreeMap<&'static str, &'static ProviderRegistration>,
}

impl Registry {
    /// Every provider registered in this binary. Fails if two share a name, naming both.
    pub fn global() -> Result<Registry, RegistryError> {
        Registry::from_registrations(inventory::iter::<ProviderRegistration>)
    }

    /// A registry over the given registrations, checked the same way as [`Registry::global`].
    pub fn from_registrations(
        registrations: impl IntoIterator<Item = &'static ProviderRegistration>,
    ) -> Result<Registry, RegistryError> {
        let mut all: Vec<_> = registrations.into_iter().collect();
        // inventory's order is unspecified: sort so errors name the pair the same way each run.
        all.sort_by_key(|r| (r.name, r.origin()));
        let mut providers = BTreeMap::new();
        for registration in all {
            if NO_PROVIDER_NAMES.contains(&registration.name) {
                return Err(RegistryError::ReservedName {
                    name: registration.name,
                    origin: registration.origin(),
                });
            }
            if let Some(first) = providers.insert(registration.name, registration) {
                return Err(RegistryError::Duplicate {
                    name: registration.name,
                    first: first.origin(),
                    second: registration.origin(),
                });
            }
        }
        Ok(Registry { providers })
    }

    /// The registered names, sorted.
    pub fn names(&self) -> Vec<&'static str> {
        self.providers.keys().copied().collect()
    }

    /// Whether a provider is registered under `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.providers.contains_key(name)
    }

    /// Looks a provider up and builds it, as upstream's `InitCloudProvider`:
    ///
    /// - `""` and `"external"` mean no provider in this process: `Ok(None)`;
    /// - an unknown name is an error listing the registered names;
    /// - the `--cloud-config` file, if given, is read and passed to the factory; an unreadable
    ///   file or a failing factory is an error naming the provider and the path.
    pub fn init_cloud_provider(
        &self,
        name: &str,
        config_path: Option<&Path>,
    ) -> Result<Option<Arc<dyn CloudProvider>>, RegistryError> {
        if NO_PROVIDER_NAMES.contains(&name) {
            tracing::info!(
                name,
                "no cloud provider in this process (external or unset)"
            );
            return Ok(None);
        }
        let registration = self.lookup(name)?;
        let config = config_path
            .map(|path| {
                CloudConfig::read(path).map_err(|source| RegistryError::ConfigUnreadable {
                    provider: name.to_owned(),
                    path: path.to_owned(),
                    source,
                })
            })
            .transpose()?;
        self.build(registration, config.as_ref()).map(Some)
    }

    /// Builds the provider called `name` from a config already in memory.
    pub fn create(
        &self,
        name: &str,
        config: Option<&CloudConfig>,
    ) -> Result<Arc<dyn CloudProvider>, RegistryError> {
        let registration = self.lookup(name)?;
        self.build(registration, config)
    }

    fn lookup(&self, name: &str) -> Result<&'static ProviderRegistration, RegistryError> {
        self.providers
            .get(name)
            .copied()
            .ok_or_else(|| RegistryError::UnknownProvider {
                name: name.to_owned(),
                registered: self.names(),
            })
    }

    fn build(
        &self,
        registration: &ProviderRegistration,
        config: Option<&CloudConfig>,
    ) -> Result<Arc<dyn CloudProvider>, RegistryError> {
        (registration.factory)(config).map_err(|source| RegistryError::FactoryFailed {
            provider: registration.name.to_owned(),
            config_path: config.map(|c| c.path().to_owned()),
            source,
        })
    }
}

/// Looks up and builds a provider from the providers linked into this binary. See
/// [`Registry::init_cloud_provider`].
pub fn init_cloud_provider(
    name: &str,
    config_path: Option<&Path>,
) -> Result<Option<Arc<dyn CloudProvider>>, RegistryError> {
    Registry::global()?.init_cloud_provider(name, config_path)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Named(&'static str);
    impl CloudProvider for Named {
        fn provider_name(&self) -> &str {
            self.0
        }
    }

    fn alpha(_: Option<&CloudConfig>) -> CloudResult<Arc<dyn CloudProvider>> {
        Ok(Arc::new(Named("alpha")))
    }

    fn echo_config(config: Option<&CloudConfig>) -> CloudResult<Arc<dyn CloudProvider>> {
        match config {
            None => Ok(Arc::new(Named("no-config"))),
            Some(c) if c.as_str()? == "ok" => Ok(Arc::new(Named("configured"))),
            Some(c) => Err(CloudError::message(format!("bad config {:?}", c.as_str()?))),
        }
    }

    static ALPHA: ProviderRegistration =
        ProviderRegistration::new("alpha", alpha, "a::b", "a.rs", 1);
    static ALPHA_AGAIN: ProviderRegistration =
        ProviderRegistration::new("alpha", alpha, "c::d", "c.rs", 9);
    static ECHO: ProviderRegistration =
        ProviderRegistration::new("echo", echo_config, "e", "e.rs", 2);
    static EXTERNAL: ProviderRegistration =
        ProviderRegistration::new("external", alpha, "x", "x.rs", 3);

    // Upstream `k8s.io/cloud-provider/plugins.go` `RegisterCloudProvider` refuses a name
    // registered twice; ours also names both registrations.
    #[test]
    fn a_name_registered_twice_is_an_error_naming_both_registrations() {
        let err = Registry::from_registrations([&ALPHA, &ECHO, &ALPHA_AGAIN]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cloud provider \"alpha\" is registered twice: by a::b (a.rs:1) and by c::d (c.rs:9)"
        );
    }

    #[test]
    fn reserved_names_cannot_be_registered() {
        let err = Registry::from_registrations([&EXTERNAL]).unwrap_err();
        assert!(matches!(
            err,
            RegistryError::ReservedName {
                name: "external",
                ..
            }
        ));
    }

    // Upstream `plugins.go` `InitCloudProvider`: an unknown name is an error; ours lists what is
    // registered.
    #[test]
    fn an_unknown_provider_is_an_error_listing_the_registered_names() {
        let registry = Registry::from_registrations([&ECHO, &ALPHA]).unwrap();
        let err = registry.init_cloud_provider("nope", None).err().unwrap();
        assert_eq!(
            err.to_string(),
            "unknown cloud provider \"nope\"; registered providers: alpha, echo"
        );
        let empty = Registry::from_registrations([]).unwrap();
        let err = empty.init_cloud_provider("nope", None).err().unwrap();
        assert!(err.to_string().contains("use my_provider as _;"), "{err}");
    }

    // Upstream `plugins.go` `InitCloudProvider`: "" and "external" mean no provider.
    #[test]
    fn an_empty_or_external_provider_name_builds_no_provider() {
        let registry = Registry::from_registrations([&ALPHA]).unwrap();
        assert!(registry.init_cloud_provider("", None).unwrap().is_none());
        assert!(
            registry
                .init_cloud_provider("external", None)
                .unwrap()
                .is_none()
        );
    }

    // Upstream `plugins.go` `InitCloudProvider`: no --cloud-config gives the factory nil; an
    // unreadable path is an error.
    #[test]
    fn the_factory_gets_the_cloud_config_or_none_and_an_unreadable_one_is_an_error() {
        let registry = Registry::from_registrations([&ECHO]).unwrap();
        let cloud = registry.init_cloud_provider("echo", None).unwrap().unwrap();
        assert_eq!(cloud.provider_name(), "no-config");

        let dir = std::env::temp_dir().join(format!("ccm-registry-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.conf");
        std::fs::write(&good, "ok").unwrap();
        let cloud = registry
            .init_cloud_provider("echo", Some(&good))
            .unwrap()
            .unwrap();
        assert_eq!(cloud.provider_name(), "configured");

        let missing = dir.join("missing.conf");
        let err = registry
            .init_cloud_provider("echo", Some(&missing))
            .err()
            .unwrap();
        assert!(matches!(err, RegistryError::ConfigUnreadable { .. }));
        assert!(err.to_string().contains("missing.conf"), "{err}");
        assert!(err.to_string().contains("\"echo\""), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn failing_factory_names_provider_and_path() {
        let registry = Registry::from_registrations([&ECHO]).unwrap();
        let config = CloudConfig::new("/etc/cloud/echo.conf", "wrong");
        let err = registry.create("echo", Some(&config)).err().unwrap();
        assert_eq!(
            err.to_string(),
            "could not init cloud provider \"echo\" (cloud config: /etc/cloud/echo.conf): bad config \"wrong\""
        );
    }
}

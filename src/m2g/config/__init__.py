"""Site configuration: the file ``m2g run --config`` reads (docs/configuration.md)."""

from m2g.config.site import SiteConfig, SiteConfigError, load_site_config, parse_site_config

__all__ = ["SiteConfig", "SiteConfigError", "load_site_config", "parse_site_config"]

//! SSRF protection: which addresses a delivery may connect to. The check
//! runs on the *resolved* address (a custom DNS resolver), so a hostname
//! that resolves to a metadata address is refused like the literal is.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// Always refused unless allowed by `--allow-cidr`: link-local (which holds
/// the cloud metadata endpoints 169.254.169.254 and fd00:ec2::254's
/// neighbourhood), unspecified, broadcast and multicast.
const ALWAYS_DENIED: &[&str] = &[
    "169.254.0.0/16",
    "fe80::/10",
    "fd00:ec2::254/128",
    "100.100.100.200/32",
    "0.0.0.0/8",
    "::/128",
    "255.255.255.255/32",
    "224.0.0.0/4",
    "ff00::/8",
];

/// Refused with `--deny-private`: RFC 1918, loopback, CGNAT, unique local.
const PRIVATE: &[&str] = &[
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "127.0.0.0/8",
    "100.64.0.0/10",
    "::1/128",
    "fc00::/7",
];

#[derive(Clone, Debug)]
pub struct AddressPolicy {
    denied: Vec<IpNet>,
    allowed: Vec<IpNet>,
    /// Proxy host names: the guard is for targets, and an egress proxy
    /// often sits on a private address.
    exempt: Vec<String>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("address {0} is blocked by the SSRF policy (see --deny-private / --allow-cidr)")]
pub struct Blocked(pub IpAddr);

impl Default for AddressPolicy {
    fn default() -> Self {
        AddressPolicy::new(false, vec![])
    }
}

impl AddressPolicy {
    pub fn new(deny_private: bool, allowed: Vec<IpNet>) -> Self {
        let mut denied: Vec<IpNet> = ALWAYS_DENIED
            .iter()
            .filter_map(|n| n.parse().ok())
            .collect();
        if deny_private {
            denied.extend(PRIVATE.iter().filter_map(|n| n.parse::<IpNet>().ok()));
        }
        AddressPolicy {
            denied,
            allowed,
            exempt: vec![],
        }
    }

    /// This policy, with these (proxy) host names resolved unchecked.
    pub fn exempting(&self, hosts: Vec<String>) -> AddressPolicy {
        AddressPolicy {
            exempt: hosts,
            ..self.clone()
        }
    }

    /// Checks a target that a proxy will connect to: the proxy resolves its
    /// name, so the guard resolves it here first and refuses it if any
    /// address is blocked. A name that does not resolve here is left to the
    /// proxy (it may see names this host cannot).
    pub async fn check_target(&self, url: &url::Url) -> Result<(), Blocked> {
        if let Some(ip) = literal_ip(url) {
            return self.check(ip);
        }
        let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
            return Ok(());
        };
        let Ok(found) = tokio::net::lookup_host((host, port)).await else {
            return Ok(());
        };
        found.into_iter().try_for_each(|a| self.check(a.ip()))
    }

    pub fn check(&self, ip: IpAddr) -> Result<(), Blocked> {
        // An IPv4-mapped IPv6 address is judged as the IPv4 address it is.
        let ip = match ip {
            IpAddr::V6(v6) => v6
                .to_ipv4_mapped()
                .map(IpAddr::V4)
                .unwrap_or(IpAddr::V6(v6)),
            v4 => v4,
        };
        if self.allowed.iter().any(|n| n.contains(&ip)) {
            return Ok(());
        }
        if self.denied.iter().any(|n| n.contains(&ip)) {
            return Err(Blocked(ip));
        }
        Ok(())
    }

    /// The resolver reqwest uses, filtering every answer through `check`.
    pub fn resolver(self: &Arc<Self>) -> Arc<GuardedResolver> {
        Arc::new(GuardedResolver {
            policy: self.clone(),
        })
    }
}

/// Resolves with the system resolver, then drops blocked addresses. When
/// none is left, the connection fails with [`Blocked`].
#[derive(Debug)]
pub struct GuardedResolver {
    policy: Arc<AddressPolicy>,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        Box::pin(async move {
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((name.as_str(), 0)).await?.collect();
            if policy
                .exempt
                .iter()
                .any(|h| h.eq_ignore_ascii_case(name.as_str()))
            {
                return Ok(Box::new(found.into_iter()) as Addrs);
            }
            let mut first_blocked = None;
            let allowed: Vec<SocketAddr> = found
                .into_iter()
                .filter(|a| match policy.check(a.ip()) {
                    Ok(()) => true,
                    Err(b) => {
                        first_blocked.get_or_insert(b);
                        false
                    }
                })
                .collect();
            match (allowed.is_empty(), first_blocked) {
                (true, Some(b)) => Err(Box::new(b) as Box<dyn std::error::Error + Send + Sync>),
                _ => Ok(Box::new(allowed.into_iter()) as Addrs),
            }
        })
    }
}

/// Finds a [`Blocked`] among an error's causes.
pub fn blocked_cause<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a Blocked> {
    let mut cur: Option<&'a (dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(b) = err.downcast_ref::<Blocked>() {
            return Some(b);
        }
        cur = err.source();
    }
    None
}

/// The IP of a URL whose host is a literal address (reqwest does not
/// resolve those, so they are checked separately).
pub fn literal_ip(url: &url::Url) -> Option<IpAddr> {
    match url.host()? {
        url::Host::Ipv4(v4) => Some(IpAddr::V4(v4)),
        url::Host::Ipv6(v6) => Some(IpAddr::V6(v6)),
        url::Host::Domain(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn metadata_and_link_local_are_blocked_by_default() {
        let p = AddressPolicy::default();
        assert!(p.check(ip("169.254.169.254")).is_err());
        assert!(p.check(ip("fe80::1")).is_err());
        assert!(p.check(ip("::ffff:169.254.169.254")).is_err(), "mapped v4");
        assert!(p.check(ip("127.0.0.1")).is_ok());
        assert!(p.check(ip("10.1.2.3")).is_ok());
        assert!(p.check(ip("93.184.216.34")).is_ok());
    }

    #[test]
    fn deny_private_and_allow_cidr() {
        let p = AddressPolicy::new(true, vec!["10.9.0.0/16".parse().unwrap()]);
        for denied in [
            "127.0.0.1",
            "10.1.1.1",
            "192.168.1.1",
            "172.20.0.1",
            "::1",
            "fd12::1",
        ] {
            assert_eq!(p.check(ip(denied)), Err(Blocked(ip(denied))), "{denied}");
        }
        assert!(
            p.check(ip("10.9.3.4")).is_ok(),
            "a hole punched by --allow-cidr"
        );
        assert!(p.check(ip("8.8.8.8")).is_ok());
    }
}

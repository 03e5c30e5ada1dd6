//! What the options of `hoptrace tap` configure: a broker tap or a store tap, the hops
//! they report resolved from the pipeline spec.

use anyhow::{Context as _, bail};
use hoptrace_broker::url::{Endpoint, UrlError};
use hoptrace_probe::HopId;
use hoptrace_publisher::tap::TapConfig;
use hoptrace_tap::{StoreKind, StoreTapConfig, StoreUrl};

use super::{HopArgs, TapArgs};
use crate::collect::load_spec;

impl TapArgs {
    /// The broker tap's configuration, the reported hop resolved from the pipeline spec.
    ///
    /// # Errors
    /// An address that names neither a broker nor a store, a hop the spec does not
    /// declare.
    pub fn broker_config(&self) -> anyhow::Result<TapConfig> {
        let endpoint = match Endpoint::parse(&self.from) {
            Err(UrlError::UnknownScheme(from)) => bail!(
                "--from {from:?}: the address must name a broker (mqtt://, kafka://) or a store ({})",
                StoreKind::ALL
                    .map(|k| format!("{}://", k.scheme()))
                    .join(", ")
            ),
            other => other.context("--from")?,
        };
        let mut c = TapConfig::new(endpoint);
        c.topics.clone_from(&self.topics);
        c.carrier = self.carrier;
        if let Some(exporter) = self.collector.exporter_config("hoptrace-tap") {
            c.hop = self.hop_spec.resolve(&self.hop)?;
            c.collector = Some(exporter);
        }
        c.use_log_append_time = !self.no_log_append_time;
        c.publishers = (!self.publishers.is_empty()).then(|| self.publishers.clone());
        c.duration = self.duration;
        c.max_messages = self.messages;
        Ok(c)
    }

    /// Whether `--from` names a store rather than a broker.
    #[must_use]
    pub fn is_store(&self) -> bool {
        hoptrace_tap::store::is_store_url(&self.from)
    }

    /// The store tap's configuration: the store, its polling, and the hops it reports
    /// (the queryable hop, the query's start, store_in, the spec's earliest instant),
    /// resolved from the pipeline spec.
    ///
    /// # Errors
    /// An address that does not parse, `--hop-id` (a store tap reports several hops), a
    /// hop the spec does not declare.
    pub fn store_config(&self) -> anyhow::Result<StoreTapConfig> {
        let s = &self.store;
        let url = StoreUrl::parse(&self.from).context("--from")?;
        let mut c = StoreTapConfig::new(url);
        c.poll_interval = s.poll_interval;
        c.pollers = usize::from(s.pollers);
        c.idle_poll_interval = s.idle_poll_interval;
        c.catch_up = s.catch_up;
        c.catch_up_interval = s.catch_up_every;
        c.wait_for_store = s.wait_for_store;
        c.store_host.clone_from(&s.store_host);
        c.publishers = (!self.publishers.is_empty()).then(|| self.publishers.clone());
        c.duration = self.duration;
        c.max_keys = self.messages;
        let store_in = match s.store_in.as_str() {
            "on" => Some(true),
            "off" => Some(false),
            _ => None,
        };
        let Some(exporter) = self.collector.exporter_config("hoptrace-tap") else {
            if !store_in.unwrap_or(c.url.kind.store_in_by_default()) {
                c.store_in_hop = None;
            }
            return Ok(c);
        };
        if self.hop_spec.hop_id.is_some() {
            bail!(
                "--hop-id names one hop; a store tap reports several: pass the collector's spec with --pipeline"
            );
        }
        let spec = crate::collect::load_spec(self.hop_spec.pipeline.as_deref())?;
        let find = |name: &str| spec.hop(name).map(|id| (id, name.to_owned()));
        c.queryable_hop = find(&s.queryable_hop).with_context(|| {
        format!(
            "{}: pass the collector's spec with --pipeline, or name the hop with --queryable-hop",
            spec.undeclared(&s.queryable_hop)
        )
    })?;
        c.query_start_hop = match s.query_start_hop.as_str() {
            "none" | "" => None,
            name => Some(find(name).with_context(|| {
                format!(
                    "{}: --query-start-hop none leaves it out",
                    spec.undeclared(name)
                )
            })?),
        };
        c.store_in_hop = match (store_in, find(&s.store_in_hop)) {
            (Some(false), _) => None,
            (Some(true), None) => bail!("--store-in on, but {}", spec.undeclared(&s.store_in_hop)),
            (Some(true), hop) => hop,
            (None, hop) => hop.filter(|_| c.url.kind.store_in_by_default()),
        };
        // The spec's earliest instant of the queryable hop, when it declares one: reported
        // per message, so that every stage ending there has bounds.
        c.earliest_hop = spec
            .earliest_of(&c.queryable_hop.1)
            .map(|e| find(e).expect("the spec checked its `earliest`"));
        if let Some(id) = spec.hop("publish") {
            c.publish_hop = id;
        }
        c.collector = Some(exporter);
        Ok(c)
    }
}

impl HopArgs {
    /// The id and name of the hop named `hop`: `--hop-id`, or its id in the pipeline spec.
    ///
    /// # Errors
    /// The hop is not in the pipeline spec, or the spec does not read.
    pub fn resolve(&self, hop: &str) -> anyhow::Result<(HopId, String)> {
        let id = match self.hop_id {
            Some(id) => id,
            None => {
                let spec = load_spec(self.pipeline.as_deref())?;
                let Some(HopId(id)) = spec.hop(hop) else {
                    bail!(
                        "{}: pass the collector's spec with --pipeline, or the hop's id with --hop-id",
                        spec.undeclared(hop)
                    );
                };
                id
            }
        };
        Ok((HopId(id), hop.to_owned()))
    }
}

// Package quota implements mantle.quota.v1.QuotaService: token-aware admission for the
// mesh. The router asks quota before every provider call and tells it afterwards what
// the call really cost.
//
// # What it does
//
// Each tenant has two token buckets: requests per minute (RPM) and tokens per minute
// (TPM). A bucket holds at most its per-minute limit and refills continuously at
// limit/60 s per second, so a tenant that paused for half a minute may burst half its
// limit at once.
//
//   - Reserve charges one request against RPM and the request's estimated tokens
//     (input + max output) against TPM, all or nothing: when either bucket is short,
//     neither is charged and the caller gets RESOURCE_EXHAUSTED with the bucket that
//     refused (QuotaFailure) and how long until it can cover the cost (RetryInfo). A
//     request that no bucket could ever cover (more tokens than the limit) is refused at
//     once with FAILED_PRECONDITION and reason REQUEST_TOO_LARGE: waiting cannot help.
//     Every refusal is also published as a QuotaRejectionEvent.
//   - Settle applies the real usage of a reservation: it returns the unused part of
//     the estimate to the TPM bucket, or charges the overrun (the balance may go
//     negative, which delays the tenant's next requests until the debt refills).
//   - CountTokens estimates tokens per model family. There is no exact BPE tokenizer
//     yet; counts are marked exact=false.
//
// # Reservations
//
// A reservation can be settled once. Settling it again, settling one that does not
// exist or belongs to another tenant, and settling one older than reservation_ttl all
// answer NOT_FOUND with reason RESERVATION_NOT_FOUND. That makes Settle safe to retry:
// a retried Settle whose first attempt succeeded gets NOT_FOUND and can never refund
// twice, so callers treat NOT_FOUND after a retry as "already settled".
//
// A reservation that is never settled keeps its charge: the caller may have made the
// provider call and crashed before settling, and refunding on expiry would let a
// misbehaving client spend tokens it never pays for. The tokens come back the normal
// way, through refill. A sweeper (Service.Run, driven by the injected clock) deletes
// expired reservation records so memory stays bounded.
//
// # State
//
// Bucket levels and open reservations live behind the Store interface. This package
// ships an in-memory Store for `mantle dev`, tests and single-replica deployments; a
// Redis Store (one shared view for many replicas, atomic through scripts) is planned
// and plugs in without changes to the service. quota calls no other service.
package quota

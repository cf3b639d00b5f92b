package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/alya/recovery/internal/redact"
)

func init() {
	// go-redis logs dial failures on its own; recoveryctl reports every
	// error once, itself, in its own words.
	redis.SetLogger(quietLogger{})
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// dialTimeout bounds each connection attempt, so an unreachable server is
// reported in seconds, not at the end of --timeout.
const dialTimeout = 5 * time.Second

// connectRedis returns a client for the single node of --redis-url or the
// cluster of --cluster, after checking that it answers, and how to name it
// in messages (never with a password).
func connectRedis(ctx context.Context, o *options) (redis.UniversalClient, string, error) {
	url := o.redisURL
	if url == "" && o.cluster == "" {
		url = defaultRedisURL
	}
	var opt *redis.Options
	if url != "" {
		var err error
		opt, err = redis.ParseURL(url)
		if err != nil {
			return nil, "", &usageError{fmt.Sprintf("redis URL %s: %v", redact.URL(url), redact.Error(err, url))}
		}
	}
	var (
		rdb  redis.UniversalClient
		name string
	)
	if o.cluster != "" {
		addrs := splitAddrs(o.cluster)
		if len(addrs) == 0 {
			return nil, "", &usageError{"--cluster needs at least one host:port"}
		}
		copt := &redis.ClusterOptions{Addrs: addrs, DialTimeout: dialTimeout, MaxRetries: 1, ContextTimeoutEnabled: true}
		if opt != nil { // credentials and TLS of --redis-url
			copt.Username, copt.Password, copt.TLSConfig = opt.Username, opt.Password, opt.TLSConfig
		}
		rdb = redis.NewClusterClient(copt)
		name = "Redis Cluster " + strings.Join(addrs, ",")
	} else {
		opt.DialTimeout, opt.MaxRetries, opt.ContextTimeoutEnabled = dialTimeout, 1, true
		rdb = redis.NewClient(opt)
		name = "Redis at " + redact.URL(url)
	}
	if err := rdb.Ping(ctx).Err(); err != nil {
		rdb.Close()
		return nil, "", fmt.Errorf("%s unreachable: %w", name, err)
	}
	return rdb, name, nil
}

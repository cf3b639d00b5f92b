package ops

// DefaultKeyPrefix is the key prefix of a fleet whose workers set no
// recovery.WithKeyPrefix.
const DefaultKeyPrefix = "ALYA"

// EnvKeyPrefix names the environment variable FromEnv reads the fleet's
// key prefix from.
const EnvKeyPrefix = "RECOVERY_KEY_PREFIX"

// TODO(v2, helper C): Env and FromEnv(getenv) (Env, error), with
// Env{KeyPrefix string; Postgres postgres.Config}, once package postgres
// (branch v2-postgres, helper A1) is merged.

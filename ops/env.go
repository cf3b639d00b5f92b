package ops

import (
	"github.com/alya/recovery/postgres"
)

// DefaultKeyPrefix is the key prefix of a fleet whose workers set no
// recovery.WithKeyPrefix.
const DefaultKeyPrefix = "ALYA"

// EnvKeyPrefix names the environment variable FromEnv reads the fleet's
// key prefix from.
const EnvKeyPrefix = "RECOVERY_KEY_PREFIX"

// Env is a fleet's configuration as its hosts and recoveryctl read it from
// the environment (FromEnv).
type Env struct {
	// KeyPrefix is the fleet's key prefix, for recovery.WithKeyPrefix and
	// the functions of this package: $RECOVERY_KEY_PREFIX, else
	// DefaultKeyPrefix. It is checked where it is used.
	KeyPrefix string
	// Postgres is the resetter's configuration from the RECOVERY_*
	// variables (postgres.ConfigFromEnv); its Options name the variable of
	// a value in the resetter's errors.
	Postgres postgres.Config
}

// FromEnv reads a fleet's configuration from the environment through
// getenv (os.Getenv): the key prefix (EnvKeyPrefix) and the resetter's
// RECOVERY_* variables (postgres.ConfigFromEnv). An unset or empty
// variable leaves the default. A value that cannot be parsed is an error
// wrapping recovery.ErrInvalidConfig that names the variable.
func FromEnv(getenv func(string) string) (Env, error) {
	e := Env{KeyPrefix: DefaultKeyPrefix}
	if p := getenv(EnvKeyPrefix); p != "" {
		e.KeyPrefix = p
	}
	cfg, err := postgres.ConfigFromEnv(getenv)
	if err != nil {
		return Env{}, err
	}
	e.Postgres = cfg
	return e, nil
}

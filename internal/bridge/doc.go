// Package bridge is the one route from package ops into the Worker's
// unexported recovery code: function variables the root package sets in
// its init.
package bridge

// Command ftjob-pki writes the certificates and keys of the local test control plane, using
// only the Go standard library (so a fresh machine needs nothing but Go):
//
//	ca.{crt,key}                        cluster CA (client-ca-file, root-ca-file, CSR signer)
//	apiserver.{crt,key}                 serving cert for 127.0.0.1, localhost, kubernetes.default.svc…
//	admin.{crt,key}                     user "admin", group "system:masters"
//	kube-controller-manager.{crt,key}   user "system:kube-controller-manager" (built-in RBAC)
//	kube-scheduler.{crt,key}            user "system:kube-scheduler" (built-in RBAC)
//	sa.{key,pub}                        ServiceAccount token signing key pair (RSA 2048)
//
// Existing files are kept, so a restart reuses the same CA and keys.
package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"log"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

var dir = flag.String("dir", ".", "output directory")

func exists(name string) bool { _, err := os.Stat(filepath.Join(*dir, name)); return err == nil }

func write(name, typ string, der []byte) {
	b := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	if err := os.WriteFile(filepath.Join(*dir, name), b, 0o600); err != nil {
		log.Fatal(err)
	}
}

func read(name string) *pem.Block {
	b, err := os.ReadFile(filepath.Join(*dir, name))
	if err != nil {
		log.Fatal(err)
	}
	p, _ := pem.Decode(b)
	if p == nil {
		log.Fatalf("%s: no PEM block", name)
	}
	return p
}

func newKey() *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		log.Fatal(err)
	}
	return k
}

func writeKey(name string, k crypto.Signer) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		log.Fatal(err)
	}
	write(name, "PRIVATE KEY", der)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		log.Fatal(err)
	}
	return n
}

func loadCA() (*x509.Certificate, crypto.Signer) {
	cert, err := x509.ParseCertificate(read("ca.crt").Bytes)
	if err != nil {
		log.Fatal(err)
	}
	k, err := x509.ParsePKCS8PrivateKey(read("ca.key").Bytes)
	if err != nil {
		log.Fatal(err)
	}
	return cert, k.(crypto.Signer)
}

func issue(name string, tmpl *x509.Certificate) {
	if exists(name + ".crt") {
		return
	}
	ca, caKey := loadCA()
	k := newKey()
	tmpl.SerialNumber = serial()
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().AddDate(10, 0, 0)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
	if err != nil {
		log.Fatal(err)
	}
	writeKey(name+".key", k)
	write(name+".crt", "CERTIFICATE", der)
}

func client(name, user string, groups ...string) {
	issue(name, &x509.Certificate{
		Subject:     pkix.Name{CommonName: user, Organization: groups},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

func main() {
	flag.Parse()
	if err := os.MkdirAll(*dir, 0o700); err != nil {
		log.Fatal(err)
	}
	if !exists("ca.crt") {
		k := newKey()
		tmpl := &x509.Certificate{
			SerialNumber:          serial(),
			Subject:               pkix.Name{CommonName: "finetune-operator-test-ca"},
			NotBefore:             time.Now().Add(-time.Hour),
			NotAfter:              time.Now().AddDate(10, 0, 0),
			KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
			BasicConstraintsValid: true,
			IsCA:                  true,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
		if err != nil {
			log.Fatal(err)
		}
		writeKey("ca.key", k)
		write("ca.crt", "CERTIFICATE", der)
	}
	issue("apiserver", &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.0.0.1")},
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local"},
	})
	client("admin", "admin", "system:masters")
	client("kube-controller-manager", "system:kube-controller-manager")
	client("kube-scheduler", "system:kube-scheduler")
	if !exists("sa.key") {
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			log.Fatal(err)
		}
		writeKey("sa.key", k)
		pub, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
		if err != nil {
			log.Fatal(err)
		}
		write("sa.pub", "PUBLIC KEY", pub)
	}
}

// s3rver where KvikIO's test_s3_io.py expects moto's server (stand_ins/moto/server.py starts it):
//   node s3rver_as_moto.js S3RVER_PACKAGE_DIR ADDRESS PORT DATA_DIRECTORY
// Two of moto's habits that those tests rely on, and s3rver lacks, are added here; the rest is
// s3rver's own S3:
// - any credentials: the key pair in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (the tests set
//   foobar_key) is known besides s3rver's S3RVER/S3RVER (s3rver does not check SigV4 signatures);
// - CreateBucket as AWS's us-east-1 and moto answer it: any name (the tests use "test_read" and
//   "bucket_name", which s3rver refuses for their underscore), and 200 for a bucket that exists
//   already (the tests create the same bucket once per case; s3rver answers 409).
'use strict';

const fs = require('fs');
const path = require('path');

const [s3rverDir, address, port, directory] = process.argv.slice(2);
const S3rver = require(s3rverDir);
const AWSAccount = require(path.join(s3rverDir, 'lib/models/account'));
const bucketCtrl = require(path.join(s3rverDir, 'lib/controllers/bucket'));

if (process.env.AWS_ACCESS_KEY_ID) {
  AWSAccount.DUMMY_ACCOUNT.createKeyPair(process.env.AWS_ACCESS_KEY_ID,
                                         process.env.AWS_SECRET_ACCESS_KEY || '');
}

// s3rver's routes look putBucket up on each request, so this one serves CreateBucket.
bucketCtrl.putBucket = async function putBucket(ctx) {
  const name = ctx.params.bucket;
  if (!(await ctx.store.getBucket(name))) await ctx.store.putBucket(name);
  ctx.set('Location', '/' + name);
  ctx.body = '';
};

function stop() {
  fs.rmSync(directory, {recursive: true, force: true});
  process.exit(0);
}
process.on('SIGTERM', stop);
process.on('SIGINT', stop);

new S3rver({address, port: Number(port), directory, silent: true})
    .run()
    .then(({address: a, port: p}) => console.log(`s3rver as moto listening on ${a}:${p}`))
    .catch(err => {
      console.error(err);
      process.exit(1);
    });
